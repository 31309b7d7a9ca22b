"""Jobs: submit, update, read and delete, with the built-in collector's repair rules."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from sqlalchemy import Connection
from sqlalchemy import delete

from collector.contract import JobCreatePayload
from collector.contract import JobDetail
from collector.contract import JobEventRecord
from collector.contract import JobStatus
from collector.contract import JobUpdatePayload
from collector.contract import SlurmView
from collector.store import clusters
from collector.store import counts
from collector.store import events
from collector.store import pg_driver
from collector.store import sqlite_driver
from collector.store import writes
from collector.store.identity import JOBS
from collector.store.identity import NO_CLUSTER
from collector.store.identity import JobRow
from collector.store.identity import claim
from collector.store.identity import find_for_read
from collector.store.identity import find_for_write
from collector.store.identity import is_postgres
from collector.store.identity import lock_job_id
from collector.store.identity import pick_for_read
from collector.store.identity import wire_cluster

SUMMARY_COLUMNS = ("job_id", "job_name", "status", "stage", "message", "cluster", "submitted_at", "started_at",
                   "completed_at", "updated_at", "exit_code")
# Fields a PUT sets when it sends them; a late PUT only fills them while they are null.
_FILLABLE = ("started_at", "completed_at", "exit_code", "logs_url", "benchmark_results")


@dataclasses.dataclass(frozen=True)
class WriteResult:
    """What a write did: the job's identity and status, and the event it appended if any."""

    job_id: str
    cluster: str | None
    status: str
    event: JobEventRecord | None
    # A PUT older than the job's updated_at: it filled what was unknown and moved nothing.
    late: bool = False


def placeholder_name(job_id: str) -> str:
    """The name of a row created by a PUT whose POST never arrived."""
    return f"job-{job_id}"


def _deep_merge(base: dict[str, Any], patch: dict[str, Any], *, base_wins: bool) -> dict[str, Any]:
    merged = dict(base)
    for key, value in patch.items():
        current = merged.get(key)
        if isinstance(current, dict) and isinstance(value, dict):
            merged[key] = _deep_merge(current, value, base_wins=base_wins)
        elif key not in merged or current is None or (value is not None and not base_wins):
            # A null never erases a known value: reporters send "unknown" as null.
            merged[key] = value
    return merged


def _merged(existing: dict[str, Any] | None, patch: dict[str, Any] | None, *,
            existing_wins: bool = False) -> dict[str, Any] | None:
    """Merge ``patch`` into ``existing`` key by key, recursing into nested objects."""
    if not patch:
        return existing
    return _deep_merge(existing or {}, patch, base_wins=existing_wins)


def _new_row(**fields: Any) -> JobRow:
    """A row not yet stored: every column present, unset ones null."""
    return {**dict.fromkeys(c.name for c in JOBS.c if c.name != "id"), "received_at": _now(), **fields}


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _triple(row: JobRow) -> tuple[str, str | None, str | None]:
    return row["status"], row["stage"], row["message"]


def _result(row: JobRow, event: JobEventRecord | None, *, late: bool = False) -> WriteResult:
    return WriteResult(job_id=row["job_id"], cluster=wire_cluster(row["cluster"]), status=row["status"], event=event,
                       late=late)


def submit(conn: Connection, payload: JobCreatePayload, *, cluster: str | None = None,
           credential: str | None = None) -> WriteResult:
    """Create a job in ``submitted``, or complete the identity of an existing one (POST).

    ``cluster`` is the one the request's credential settled on when the body names none;
    ``credential`` is who wrote it, kept on the event.
    """
    cluster = payload.cluster or cluster
    new = _new_row(
        cluster=cluster or NO_CLUSTER,
        job_id=payload.job_id,
        job_name=payload.job_name,
        is_placeholder=False,
        status=JobStatus.SUBMITTED.value,
        recipe=payload.recipe,
        submitted_at=payload.submitted_at,
        updated_at=payload.submitted_at,
        metadata=payload.metadata or None,
    )
    if is_postgres(conn):
        # A new job, the common case, in one round trip; anything else the general way below.
        event = writes.insert_new_job(conn, new, payload.submitted_at, credential=credential)
        if event is not None:
            return _result(new, event)
    row = find_for_write(conn, payload.job_id, cluster)
    if row is None:
        return _result(new, writes.save(conn, new, None, None, payload.submitted_at, commit=True,
                                        credential=credential))
    original = dict(row)
    claim(row, cluster)
    row["received_at"] = _now()
    # A late or repeated POST never rewinds status; it only fills in what is missing.
    if row["is_placeholder"]:
        row["job_name"] = payload.job_name
        row["is_placeholder"] = False
    if row["recipe"] is None and payload.recipe:
        row["recipe"] = payload.recipe
    if payload.submitted_at < row["submitted_at"]:
        row["submitted_at"] = payload.submitted_at
    # Submit-time metadata is older than what the started report sent: keep the newer keys.
    row["metadata"] = _merged(row["metadata"], payload.metadata, existing_wins=True)
    return _result(row, writes.save(conn, row, original, _triple(row), payload.submitted_at, commit=True,
                                    credential=credential))


def update(conn: Connection, job_id: str, payload: JobUpdatePayload, *, cluster: str | None = None,
           event_at: dt.datetime | None = None, credential: str | None = None) -> WriteResult:
    """Apply a PUT, creating a placeholder row when the job's POST never arrived.

    ``cluster`` and ``credential`` as for ``submit``; ``event_at`` stamps the event when it
    is not the payload's ``updated_at`` (a stale mark).
    """
    reported = payload.metadata or {}
    reported_name = reported.get("job_name") if isinstance(reported.get("job_name"), str) else None
    cluster = payload.reported_cluster() or cluster
    if event_at is None and is_postgres(conn):
        # A PUT on its job's own row in order, or a job's first, in one round trip; anything else the general way below.
        applied = writes.put_stored(conn, job_id, cluster, payload, reported_name, _now(), credential=credential)
        if applied is not None:
            return _result(*applied)
    row = find_for_write(conn, job_id, cluster)
    if row is None:
        original = before = None
        first_seen = min(payload.updated_at, payload.started_at or payload.updated_at)
        row = _new_row(
            cluster=cluster or NO_CLUSTER,
            job_id=job_id,
            job_name=reported_name or placeholder_name(job_id),
            is_placeholder=True,
            submitted_at=first_seen,
            updated_at=payload.updated_at,
        )
    else:
        original = dict(row)
        before = _triple(row)
        claim(row, cluster)
        row["received_at"] = _now()
        if row["is_placeholder"] and reported_name and row["job_name"] == placeholder_name(job_id):
            row["job_name"] = reported_name

    late = original is not None and is_late(row, payload.updated_at)
    if late:
        _fill_unknown(row, payload)
    else:
        _apply(row, payload)
    event = writes.save(conn, row, original, before, event_at or payload.updated_at, commit=True,
                        credential=credential)
    return _result(row, event, late=late)


def is_late(row: JobRow, updated_at: dt.datetime) -> bool:
    """Whether a PUT stamped ``updated_at`` is older than the newest one applied to ``row``.

    A job still in ``submitted`` has had no report applied: its ``updated_at`` is the POST's
    ``submitted_at`` (another host's clock) or, for a row a blob upload created, ours. The
    first PUT is measured against neither, or a head node whose clock is behind the login
    node's would never get its job out of ``submitted``.
    """
    late: bool = row["status"] != JobStatus.SUBMITTED.value and updated_at < row["updated_at"]
    return late


def _apply(row: JobRow, payload: JobUpdatePayload) -> None:
    """Apply a PUT that is not late: it sets the status and becomes the job's watermark."""
    # On PostgreSQL a PUT on its job's own row runs these rules (with _merged, the
    # placeholder's name and, for a job's first PUT, the new row update() builds) in
    # collector_put_job(), revision 0017: a change here needs a revision that changes that
    # function the same way.
    status = payload.status.value
    if status != row["status"]:
        # stage and message describe the status they came with; a new status without
        # them must not inherit the previous one's ("Running benchmark" on a failure).
        row["stage"] = row["message"] = None
    row["status"] = status
    if payload.stage is not None:
        row["stage"] = payload.stage.value
    if payload.message is not None:
        row["message"] = payload.message
    for name in _FILLABLE:
        value = getattr(payload, name)
        if value is not None:
            row[name] = value
    row["artifacts"] = _merged(row["artifacts"], payload.artifacts)
    row["metadata"] = _merged(row["metadata"], payload.metadata)
    # Not older than the watermark (is_late), except the first report on a submitted row,
    # which replaces the submit's stamp so the reporter's later PUTs compare with its own clock.
    row["updated_at"] = payload.updated_at


def _fill_unknown(row: JobRow, payload: JobUpdatePayload) -> None:
    """Take from a late PUT only what the job does not know yet; status, stage and message stay."""
    for name in _FILLABLE:
        value = getattr(payload, name)
        if value is not None and row[name] is None:
            row[name] = value
    # The stored keys are newer: the late PUT fills only missing or null ones.
    row["artifacts"] = _merged(row["artifacts"], payload.artifacts, existing_wins=True)
    row["metadata"] = _merged(row["metadata"], payload.metadata, existing_wins=True)


def ensure(conn: Connection, job_id: str, cluster: str | None, now: dt.datetime, *,
           credential: str | None = None, prefetch: pg_driver.Query | None = None) -> tuple[int, str | None, bool]:
    """The job a blob upload lands on (primary key, wire cluster), as a PUT would resolve it, and whether it is new.

    A job with no row yet gets a placeholder in ``submitted`` (and with it an event,
    hence the flag); a cluster named by the upload claims a cluster-less row. Holds the
    job id's write lock until commit. ``prefetch`` as in ``find_for_write``.
    """
    row = find_for_write(conn, job_id, cluster, prefetch=prefetch)
    if row is None:
        row = _new_row(cluster=cluster or NO_CLUSTER, job_id=job_id, job_name=placeholder_name(job_id),
                       is_placeholder=True, status=JobStatus.SUBMITTED.value, submitted_at=now, updated_at=now,
                       received_at=now)
        writes.save(conn, row, None, None, now, credential=credential)
        return row["id"], wire_cluster(row["cluster"]), True
    elif cluster and row["cluster"] == NO_CLUSTER:
        original = dict(row)
        claim(row, cluster)
        writes.save(conn, row, original, _triple(row), now, credential=credential)
    return row["id"], wire_cluster(row["cluster"]), False


def _summary_fields(row: JobRow) -> dict[str, Any]:
    return {**{name: row[name] for name in SUMMARY_COLUMNS}, "cluster": wire_cluster(row["cluster"])}


# A job's detail on PostgreSQL: its rows, their events and their Slurm view, keyed by the
# job id (and the cluster, when the read names one) so the three go in one round trip
# with BEGIN and COMMIT; the row the read means is picked from them afterwards. Through
# SQLAlchemy they were five round trips, and most of a detail's CPU.
_DETAIL_OF = "j.job_id = %(job_id)s AND (%(cluster)s::text IS NULL OR j.cluster = %(cluster)s)"
DETAIL_ROWS = pg_driver.statement("collector_detail_rows", "SELECT {} FROM jobs j WHERE {} ORDER BY j.id".format(
    ", ".join(f"j.{name}" for name in pg_driver.COLUMNS), _DETAIL_OF))
DETAIL_EVENTS = pg_driver.statement("collector_detail_events", (
    "SELECT e.id, e.job_pk, e.status, e.stage, e.message, e.created_at, e.credential "
    f"FROM jobs j JOIN job_events e ON e.job_pk = j.id WHERE {_DETAIL_OF} ORDER BY e.id"))
DETAIL_SLURM = pg_driver.statement("collector_detail_slurm", (
    "SELECT s.job_pk, s.state, s.reason, s.state_since, s.observed_at, s.gone_since "
    f"FROM jobs j JOIN slurm_jobs s ON s.job_pk = j.id WHERE {_DETAIL_OF}"))
# On SQLite the same reads go one by one, by the row's key, straight to sqlite3.
_EVENTS_OF_JOB = sqlite_driver.read(
    "SELECT id, status, stage, message, created_at, credential FROM job_events WHERE job_pk = ? ORDER BY id",
    [events.EVENTS.c[name] for name in ("id", "status", "stage", "message", "created_at", "credential")])
_SLURM_OF_JOB = sqlite_driver.read(
    "SELECT state, reason, state_since, observed_at, gone_since FROM slurm_jobs WHERE job_pk = ?",
    [clusters.SLURM.c[name] for name in ("state", "reason", "state_since", "observed_at", "gone_since")])


def detail(conn: Connection, job_id: str, cluster: str | None) -> JobDetail:
    """One job with its ordered event history."""
    if is_postgres(conn):
        params = {"job_id": job_id, "cluster": cluster or None}
        rows, stored, slurm = pg_driver.execute_all(
            conn, [pg_driver.Query(statement, params) for statement in (DETAIL_ROWS, DETAIL_EVENTS, DETAIL_SLURM)],
            commit=True)
        row = pick_for_read(pg_driver.job_rows(rows), job_id, cluster)
        # Without a cluster the other rows' events came too: the row's own are kept.
        own = [pg_driver.in_utc(event) for event in stored if event["job_pk"] == row["id"]]
        view = next((clusters.slurm_of(pg_driver.in_utc(s)) for s in slurm if s["job_pk"] == row["id"]), None)
        return _detail(row, [events.stored(row, event) for event in own], view)
    row = pick_for_read([r for r in sqlite_driver.job_rows(conn, job_id) if not cluster or r["cluster"] == cluster],
                        job_id, cluster)
    history = [events.stored(row, event) for event in sqlite_driver.fetch(conn, _EVENTS_OF_JOB, (row["id"],))]
    view = next((clusters.slurm_of(s) for s in sqlite_driver.fetch(conn, _SLURM_OF_JOB, (row["id"],))), None)
    return _detail(row, history, view)


def _detail(row: JobRow, history: list[JobEventRecord], slurm: SlurmView | None) -> JobDetail:
    return JobDetail(
        **_summary_fields(row),
        recipe=row["recipe"],
        logs_url=row["logs_url"],
        benchmark_results=row["benchmark_results"],
        artifacts=row["artifacts"],
        metadata=row["metadata"],
        events=history,
        slurm=slurm,
    )


def resolve(conn: Connection, job_id: str, cluster: str | None) -> tuple[int, str | None]:
    """The primary key and wire cluster of the job a read names."""
    row = find_for_read(conn, job_id, cluster)
    return row["id"], wire_cluster(row["cluster"])


def remove(conn: Connection, job_id: str, cluster: str | None) -> str | None:
    """Delete a job and everything under it; returns its wire cluster."""
    lock_job_id(conn, job_id)
    row = find_for_read(conn, job_id, cluster)
    # The database cascades to events (and blobs) without loading them.
    conn.execute(delete(JOBS).where(JOBS.c.id == row["id"]))
    counts.move(conn, (row["cluster"], row["status"]), None)
    return wire_cluster(row["cluster"])
