"""Lifecycle events: the append rule and the cursor feeds."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import insert
from sqlalchemy import select
from sqlalchemy import text
from sqlalchemy import Connection

from collector.contract import JobEventRecord
from collector.models import Job
from collector.models import JobEvent
from collector.store.identity import FEED_LOCK
from collector.store.identity import JobRow
from collector.store.identity import is_postgres
from collector.store.identity import wire_cluster

_RECORD_COLUMNS = (
    JobEvent.id,
    Job.job_id,
    Job.cluster,
    JobEvent.status,
    JobEvent.stage,
    JobEvent.message,
    JobEvent.created_at,
)


def _record(row) -> JobEventRecord:
    return JobEventRecord(
        id=row.id,
        job_id=row.job_id,
        cluster=wire_cluster(row.cluster),
        status=row.status,
        stage=row.stage,
        message=row.message,
        created_at=row.created_at,
    )


# Sequence values are handed out at INSERT but become visible at COMMIT, so two writers
# can commit ids out of order and a poller past the larger id would skip the smaller one
# forever. Taking one advisory lock before the id is drawn and holding it to COMMIT makes
# commit order equal id order. It must be the last lock a transaction takes (callers
# append last and commit at once), which also rules out deadlocks. The MATERIALIZED CTE
# makes PostgreSQL take the lock before it evaluates the id default.
EVENTS = JobEvent.__table__
_APPEND_SERIALISED = text(
    "WITH feed_lock AS MATERIALIZED (SELECT pg_advisory_xact_lock(:namespace, 0)) "
    "INSERT INTO job_events (job_pk, status, stage, message, created_at) "
    "SELECT :job_pk, :status, :stage, :message, :created_at FROM feed_lock "
    "RETURNING id"
)


def append_if_changed(
    conn: Connection, job: JobRow, before: tuple[str, str | None, str | None] | None, created_at: dt.datetime
) -> JobEventRecord | None:
    """Append an event iff the job's (status, stage, message) changed from ``before``.

    Every change of that triple appends an event carrying it, so a job row's triple is
    always its last event's: comparing with the row as it was saves reading the event.
    ``before`` is None for a row that was just created.
    """
    current = (job["status"], job["stage"], job["message"])
    if before == current:
        return None
    values = dict(job_pk=job["id"], status=current[0], stage=current[1], message=current[2], created_at=created_at)
    if is_postgres(conn):
        event_id = conn.execute(_APPEND_SERIALISED, {**values, "namespace": FEED_LOCK}).scalar_one()
    else:
        # SQLite needs no lock: BEGIN IMMEDIATE already admits one writer at a time.
        event_id = conn.execute(insert(EVENTS).values(values).returning(EVENTS.c.id)).scalar_one()
    return record(job, event_id, created_at)


def record(job: JobRow, event_id: int, created_at: dt.datetime) -> JobEventRecord:
    """The wire record of the event just appended for ``job``."""
    return JobEventRecord(
        id=event_id,
        job_id=job["job_id"],
        cluster=wire_cluster(job["cluster"]),
        status=job["status"],
        stage=job["stage"],
        message=job["message"],
        created_at=created_at,
    )


def job_events(conn: Connection, job_pk: int, *, after: int = 0, limit: int | None = None) -> list[JobEventRecord]:
    """One job's events with ``id > after``, oldest first."""
    query = (
        select(*_RECORD_COLUMNS)
        .join(Job, Job.id == JobEvent.job_pk)
        .where(JobEvent.job_pk == job_pk, JobEvent.id > after)
        .order_by(JobEvent.id)
    )
    if limit is not None:
        query = query.limit(limit)
    return [_record(row) for row in conn.execute(query)]


def feed(
    conn: Connection,
    *,
    after: int,
    limit: int,
    job_id: str | None = None,
    cluster: str | None = None,
) -> list[JobEventRecord]:
    """Events across every job with ``id > after``, oldest first, optionally filtered."""
    query = select(*_RECORD_COLUMNS).join(Job, Job.id == JobEvent.job_pk).where(JobEvent.id > after)
    if job_id is not None:
        query = query.where(Job.job_id == job_id)
    if cluster is not None:
        query = query.where(Job.cluster == cluster)
    return [_record(row) for row in conn.execute(query.order_by(JobEvent.id).limit(limit))]


def next_cursor(events: list[JobEventRecord], after: int) -> int | None:
    """The last id returned, else the cursor passed in, else null on an empty feed."""
    if events:
        return events[-1].id
    return after if after > 0 else None
