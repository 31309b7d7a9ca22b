"""Stale jobs: active jobs that left Slurm's queue or went silent, marked failed so they stop counting as running.

Two observations make a job stale, each with its own configurable wait:

- **left the queue**: the cluster probe found the job finished in Slurm (or no longer
  listed) ``grace`` seconds ago, and the job has sent nothing since then;
- **silent**: nothing at all (no POST or PUT, no log or capture bytes) for ``silence`` seconds.

Both are judged on the collector's clock (``jobs.received_at``, the blobs' ``updated_at``),
never on the reporter's stamps: a job replayed from an outbox days later, or reported from
a host whose clock is wrong, is alive for as long as it keeps sending.

Marking is an ordinary update to ``failed`` (an event, the counts, the streams), with
a message that says what was observed and when. A later real report still wins: the mark
keeps the job's ``updated_at`` (the last reporter stamp, the watermark late PUTs are judged
by), so any PUT not older than the last real report is applied after it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from sqlalchemy import ColumnElement
from sqlalchemy import Connection
from sqlalchemy import RowMapping
from sqlalchemy import exists
from sqlalchemy import select

from collector.contract import JobStatus
from collector.contract import JobUpdatePayload
from collector.contract import format_timestamp
from collector.models import BlobFile
from collector.store import jobs
from collector.store.clusters import ACTIVE
from collector.store.clusters import SLURM
from collector.store.clusters import SLURM_FINISHED
from collector.store.core import table
from collector.store.identity import JOBS
from collector.store.identity import find_for_write
from collector.store.identity import wire_cluster

# Who a stale mark's event says wrote it: the collector itself, not any credential.
SWEEPER = "collector:sweeper"
BLOBS = table(BlobFile)
# Jobs marked per sweep; the next sweep takes the rest (a sweep holds no lock across jobs).
BATCH = 500


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A job that looked stale when read, and the message it would be failed with."""

    job_id: str
    cluster: str
    received_at: dt.datetime
    message: str
    # Which rule found it: "left_queue" or "silent" (the metric's label).
    rule: str


def _quiet_since(cutoff: dt.datetime) -> tuple[ColumnElement[bool], ColumnElement[bool]]:
    """Jobs with no report and no log or capture bytes after ``cutoff``."""
    return JOBS.c.received_at <= cutoff, ~exists().where(BLOBS.c.job_pk == JOBS.c.id, BLOBS.c.updated_at > cutoff)


def candidates(conn: Connection, now: dt.datetime, *, grace_s: float, silence_s: float) -> list[Candidate]:
    """The active jobs that are stale at ``now`` (``silence_s`` 0: the silence rule is off)."""
    found: dict[tuple[str, str], Candidate] = {}
    cutoff = now - dt.timedelta(seconds=grace_s)
    left = (
        select(JOBS.c.job_id, JOBS.c.cluster, JOBS.c.received_at, SLURM.c.state, SLURM.c.gone_since)
        .join(SLURM, SLURM.c.job_pk == JOBS.c.id)
        .where(JOBS.c.status.in_(ACTIVE), SLURM.c.gone_since <= cutoff, *_quiet_since(cutoff))
        .limit(BATCH)
    )
    for row in conn.execute(left).mappings():
        found[row["cluster"], row["job_id"]] = Candidate(row["job_id"], row["cluster"], row["received_at"],
                                                         _left_message(row), "left_queue")
    if silence_s > 0:
        quiet = now - dt.timedelta(seconds=silence_s)
        silent = (
            select(JOBS.c.job_id, JOBS.c.cluster, JOBS.c.received_at)
            .where(JOBS.c.status.in_(ACTIVE), *_quiet_since(quiet))
            .limit(BATCH)
        )
        for row in conn.execute(silent).mappings():
            message = (f"No report from the job since {_at(row['received_at'])} "
                       f"(nothing for more than {silence_s:g} s); marked failed by the collector")
            found.setdefault((row["cluster"], row["job_id"]),
                             Candidate(row["job_id"], row["cluster"], row["received_at"], message, "silent"))
    return list(found.values())


def _at(moment: dt.datetime) -> str:
    # Whole seconds: the message is for people; the event's own timestamp is exact.
    return format_timestamp(moment.replace(microsecond=0))


def _left_message(row: RowMapping) -> str:
    since = _at(row["gone_since"])
    if row["state"] in SLURM_FINISHED:
        seen = f"Slurm reported the job {row['state']} at {since}"
    elif row["state"]:
        seen = f"The job left Slurm's queue by {since} (last seen {row['state']})"
    else:
        seen = f"Slurm did not list the job at {since}"
    return (f"{seen} and it sent no final report (last report {_at(row['received_at'])}); "
            "marked failed by the collector")


def mark(conn: Connection, candidate: Candidate, now: dt.datetime) -> jobs.WriteResult | None:
    """Fail ``candidate`` unless it reported (or finished) since it was read; None when it did."""
    row = find_for_write(conn, candidate.job_id, candidate.cluster)  # takes the job's write lock
    if (row is None or row["cluster"] != candidate.cluster or row["status"] not in ACTIVE
            or row["received_at"] != candidate.received_at):
        return None
    payload = JobUpdatePayload(
        status=JobStatus.FAILED,
        # Our clock is not the reporter's: stamped ``now``, the mark would make every report
        # the job sent before it (or from a host whose clock is behind ours) late. It keeps
        # the last report's stamp instead, and only its event carries our time.
        updated_at=row["updated_at"],
        # The stage it was in when it was last heard from is where it died.
        stage=row["stage"],
        message=candidate.message,
        metadata={"cluster": wire_cluster(row["cluster"])} if row["cluster"] else None,
    )
    return jobs.update(conn, candidate.job_id, payload, event_at=now, credential=SWEEPER)
