"""Jobs: submit, update, read, list and delete, with the built-in collector's repair rules."""

from __future__ import annotations

import dataclasses
import datetime as dt

from sqlalchemy import delete
from sqlalchemy import func
from sqlalchemy import select
from sqlalchemy.orm import Session

from collector.contract import JobCreatePayload
from collector.contract import JobDetail
from collector.contract import JobEventRecord
from collector.contract import JobStatus
from collector.contract import JobSummary
from collector.contract import JobUpdatePayload
from collector.models import Job
from collector.store import events
from collector.store.identity import NO_CLUSTER
from collector.store.identity import find_for_read
from collector.store.identity import find_for_write
from collector.store.identity import lock_job_id
from collector.store.identity import wire_cluster


@dataclasses.dataclass(frozen=True)
class WriteResult:
    """What a write did: the job's identity and status, and the event it appended if any."""

    job_id: str
    cluster: str | None
    status: str
    event: JobEventRecord | None


def placeholder_name(job_id: str) -> str:
    """The name of a row created by a PUT whose POST never arrived."""
    return f"job-{job_id}"


def _deep_merge(base: dict, patch: dict, *, base_wins: bool) -> dict:
    merged = dict(base)
    for key, value in patch.items():
        current = merged.get(key)
        if isinstance(current, dict) and isinstance(value, dict):
            merged[key] = _deep_merge(current, value, base_wins=base_wins)
        elif key not in merged or (current is None) or (value is not None and not base_wins):
            # A null never erases a known value: reporters send "unknown" as null.
            merged[key] = value
    return merged


def _merged(existing: dict | None, patch: dict | None, *, existing_wins: bool = False) -> dict | None:
    """Merge ``patch`` into ``existing`` key by key, recursing into nested objects."""
    if not patch:
        return existing
    # Always a new dict: SQLAlchemy only notices a JSON column change on assignment.
    return _deep_merge(existing or {}, patch, base_wins=existing_wins)


def _result(job: Job, event: JobEventRecord | None) -> WriteResult:
    return WriteResult(job_id=job.job_id, cluster=wire_cluster(job.cluster), status=job.status, event=event)


def submit(session: Session, payload: JobCreatePayload) -> WriteResult:
    """Create a job in ``submitted``, or complete the identity of an existing one (POST)."""
    lock_job_id(session, payload.job_id)
    cluster = payload.cluster.strip() if payload.cluster and payload.cluster.strip() else None
    job = find_for_write(session, payload.job_id, cluster)
    if job is None:
        job = Job(
            cluster=cluster or NO_CLUSTER,
            job_id=payload.job_id,
            job_name=payload.job_name,
            is_placeholder=False,
            status=JobStatus.SUBMITTED.value,
            recipe=payload.recipe,
            submitted_at=payload.submitted_at,
            updated_at=payload.submitted_at,
            meta=payload.metadata or None,
        )
        session.add(job)
        session.flush()
        return _result(job, events.append_if_changed(session, job, payload.submitted_at))
    # A late or repeated POST never rewinds status; it only fills in what is missing.
    if job.is_placeholder:
        job.job_name = payload.job_name
        job.is_placeholder = False
    if job.recipe is None and payload.recipe:
        job.recipe = payload.recipe
    if payload.submitted_at < job.submitted_at:
        job.submitted_at = payload.submitted_at
    # Submit-time metadata is older than what the started report sent: keep the newer keys.
    job.meta = _merged(job.meta, payload.metadata, existing_wins=True)
    session.flush()
    return _result(job, None)


def update(session: Session, job_id: str, payload: JobUpdatePayload) -> WriteResult:
    """Apply a PUT, creating a placeholder row when the job's POST never arrived."""
    lock_job_id(session, job_id)
    reported = payload.metadata or {}
    reported_name = reported.get("job_name") if isinstance(reported.get("job_name"), str) else None
    job = find_for_write(session, job_id, payload.reported_cluster())
    if job is None:
        first_seen = min(payload.updated_at, payload.started_at or payload.updated_at)
        job = Job(
            cluster=payload.reported_cluster() or NO_CLUSTER,
            job_id=job_id,
            job_name=reported_name or placeholder_name(job_id),
            is_placeholder=True,
            submitted_at=first_seen,
            updated_at=payload.updated_at,
        )
        session.add(job)
    elif job.is_placeholder and reported_name and job.job_name == placeholder_name(job_id):
        job.job_name = reported_name

    status = payload.status.value
    if status != job.status:
        # stage and message describe the status they came with; a new status without
        # them must not inherit the previous one's ("Running benchmark" on a failure).
        job.stage = None
        job.message = None
    job.status = status
    if payload.stage is not None:
        job.stage = payload.stage.value
    if payload.message is not None:
        job.message = payload.message
    for name in ("started_at", "completed_at", "exit_code", "logs_url"):
        value = getattr(payload, name)
        if value is not None:
            setattr(job, name, value)
    if payload.benchmark_results is not None:
        job.benchmark_results = payload.benchmark_results
    job.artifacts = _merged(job.artifacts, payload.artifacts)
    job.meta = _merged(job.meta, payload.metadata)
    job.updated_at = max(job.updated_at or payload.updated_at, payload.updated_at)
    session.flush()
    return _result(job, events.append_if_changed(session, job, payload.updated_at))


def _common(job: Job) -> dict:
    """The fields JobSummary and JobDetail share."""
    return dict(
        job_id=job.job_id,
        job_name=job.job_name,
        status=job.status,
        stage=job.stage,
        message=job.message,
        cluster=wire_cluster(job.cluster),
        submitted_at=job.submitted_at,
        started_at=job.started_at,
        completed_at=job.completed_at,
        updated_at=job.updated_at,
        exit_code=job.exit_code,
    )


def detail(session: Session, job_id: str, cluster: str | None) -> JobDetail:
    """One job with its ordered event history."""
    job = find_for_read(session, job_id, cluster)
    return JobDetail(
        **_common(job),
        recipe=job.recipe,
        logs_url=job.logs_url,
        benchmark_results=job.benchmark_results,
        artifacts=job.artifacts,
        metadata=job.meta,
        events=events.job_events(session, job.id),
    )


def resolve(session: Session, job_id: str, cluster: str | None) -> tuple[int, str | None]:
    """The primary key and wire cluster of the job a read names."""
    job = find_for_read(session, job_id, cluster)
    return job.id, wire_cluster(job.cluster)


def page(
    session: Session, *, page: int, per_page: int, status: str | None = None, cluster: str | None = None
) -> tuple[list[JobSummary], int]:
    """A newest-first page of jobs and the number matching the filters."""
    filters = []
    if status is not None:
        filters.append(Job.status == status)
    if cluster is not None:
        filters.append(Job.cluster == cluster)
    total = session.scalar(select(func.count()).select_from(Job).where(*filters))
    rows = session.scalars(
        select(Job)
        .where(*filters)
        .order_by(Job.submitted_at.desc(), Job.id.desc())
        .limit(per_page)
        .offset((page - 1) * per_page)
    )
    return [JobSummary(**_common(job)) for job in rows], total or 0


def remove(session: Session, job_id: str, cluster: str | None) -> str | None:
    """Delete a job and everything under it; returns its wire cluster."""
    lock_job_id(session, job_id)
    job = find_for_read(session, job_id, cluster)
    # Core DELETE: the database cascades to events (and blobs) without loading them.
    session.execute(delete(Job).where(Job.id == job.id))
    return wire_cluster(job.cluster)
