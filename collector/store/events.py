"""Lifecycle events: the append rule and the cursor feeds."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import func
from sqlalchemy import select
from sqlalchemy.orm import Session

from collector.contract import JobEventRecord
from collector.models import Job
from collector.models import JobEvent
from collector.store.identity import FEED_LOCK
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


def _serialise_appends(session: Session) -> None:
    # Sequence values are handed out at INSERT but become visible at COMMIT, so two
    # writers can commit ids out of order and a poller past the larger id would skip
    # the smaller one forever. Holding one lock from INSERT to COMMIT makes commit
    # order equal id order. It must be the last lock a transaction takes (callers
    # append the event last and commit at once), which also rules out deadlocks.
    # SQLite needs nothing: BEGIN IMMEDIATE already admits one writer at a time.
    if is_postgres(session):
        session.execute(select(func.pg_advisory_xact_lock(FEED_LOCK, 0)))


def append_if_changed(
    session: Session, job: Job, created_at: dt.datetime
) -> JobEventRecord | None:
    """Append an event iff the job's (status, stage, message) differs from its last event."""
    last = session.execute(
        select(JobEvent.status, JobEvent.stage, JobEvent.message)
        .where(JobEvent.job_pk == job.id)
        .order_by(JobEvent.id.desc())
        .limit(1)
    ).first()
    current = (job.status, job.stage, job.message)
    if last is not None and tuple(last) == current:
        return None
    _serialise_appends(session)
    event = JobEvent(job_pk=job.id, status=job.status, stage=job.stage, message=job.message, created_at=created_at)
    session.add(event)
    session.flush()
    return JobEventRecord(
        id=event.id,
        job_id=job.job_id,
        cluster=wire_cluster(job.cluster),
        status=event.status,
        stage=event.stage,
        message=event.message,
        created_at=event.created_at,
    )


def job_events(session: Session, job_pk: int, *, after: int = 0, limit: int | None = None) -> list[JobEventRecord]:
    """One job's events with ``id > after``, oldest first."""
    query = (
        select(*_RECORD_COLUMNS)
        .join(Job, Job.id == JobEvent.job_pk)
        .where(JobEvent.job_pk == job_pk, JobEvent.id > after)
        .order_by(JobEvent.id)
    )
    if limit is not None:
        query = query.limit(limit)
    return [_record(row) for row in session.execute(query)]


def feed(
    session: Session,
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
    return [_record(row) for row in session.execute(query.order_by(JobEvent.id).limit(limit))]


def next_cursor(events: list[JobEventRecord], after: int) -> int | None:
    """The last id returned, else the cursor passed in, else null on an empty feed."""
    if events:
        return events[-1].id
    return after if after > 0 else None
