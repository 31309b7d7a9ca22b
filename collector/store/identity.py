"""Which row a request means: ``(cluster, job_id)`` resolution and per-job write locks."""

from __future__ import annotations

from sqlalchemy import func
from sqlalchemy import select
from sqlalchemy.orm import Session

from collector.errors import Conflict
from collector.errors import NotFound
from collector.models import Job

NO_CLUSTER = ""
# Advisory-lock namespaces (first key of pg_advisory_xact_lock(int, int)).
JOB_LOCK = 1
FEED_LOCK = 2


def wire_cluster(cluster: str) -> str | None:
    """The stored cluster as the API shows it: ``''`` (unknown) reads as ``null``."""
    return cluster or None


def is_postgres(session: Session) -> bool:
    """Whether the session talks to PostgreSQL (SQLite serialises writers by itself)."""
    return session.get_bind().dialect.name == "postgresql"


def lock_job_id(session: Session, job_id: str) -> None:
    """Serialise writers of one job id until commit, so resolve-then-create cannot race."""
    if is_postgres(session):
        session.execute(select(func.pg_advisory_xact_lock(JOB_LOCK, func.hashtext(job_id))))


def _rows(session: Session, job_id: str) -> list[Job]:
    return list(session.scalars(select(Job).where(Job.job_id == job_id).order_by(Job.id)))


def _ambiguous(job_id: str, rows: list[Job]) -> Conflict:
    clusters = sorted(wire_cluster(r.cluster) or "" for r in rows)
    return Conflict(
        f"job {job_id} exists on several clusters ({', '.join(clusters)}); say which with ?cluster=",
        extra={"clusters": clusters},
    )


def find_for_write(session: Session, job_id: str, cluster: str | None) -> Job | None:
    """The row a write lands on, claiming a cluster-less row when the write names a cluster.

    Returns None when the write should create a new row for ``(cluster or '', job_id)``.
    """
    rows = _rows(session, job_id)
    bare = next((r for r in rows if r.cluster == NO_CLUSTER), None)
    if cluster:
        exact = next((r for r in rows if r.cluster == cluster), None)
        if exact is not None:
            return exact
        if bare is not None:
            bare.cluster = cluster
        return bare
    if bare is not None:
        return bare
    if len(rows) > 1:
        raise _ambiguous(job_id, rows)
    return rows[0] if rows else None


def find_for_read(session: Session, job_id: str, cluster: str | None) -> Job:
    """The row a read or delete means, by the same rule as a write without a cluster."""
    if cluster:
        job = session.scalar(select(Job).where(Job.cluster == cluster, Job.job_id == job_id))
        if job is None:
            raise NotFound(f"job {job_id} not found on cluster {cluster}")
        return job
    rows = _rows(session, job_id)
    bare = next((r for r in rows if r.cluster == NO_CLUSTER), None)
    if bare is not None:
        return bare
    if len(rows) > 1:
        raise _ambiguous(job_id, rows)
    if not rows:
        raise NotFound(f"job {job_id} not found")
    return rows[0]
