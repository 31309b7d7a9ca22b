"""Which row a request means: ``(cluster, job_id)`` resolution and per-job write locks."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection
from sqlalchemy import bindparam
from sqlalchemy import select

from collector.models import Job
from collector.store import pg_driver
from collector.store import sqlite_driver
from collector.store.core import table
from collector.store.errors import Conflict
from collector.store.errors import NotFound

NO_CLUSTER = ""
# Advisory-lock namespaces (first key of pg_advisory_xact_lock(int, int)).
JOB_LOCK = 1
# Retired with the feed lock (revision 0008); reserved: a process still on older code
# takes it while an upgrade rolls out.
FEED_LOCK = 2

# A job row as a plain dict keyed by column name. The write path runs on Core rather
# than ORM instances: it is the hottest path in the service and needs no identity map.
JobRow = dict[str, Any]
JOBS = table(Job)
# Built once: a statement object reused across requests skips construction and cache-key work.
_ROWS_OF_JOB_ID = select(JOBS).where(JOBS.c.job_id == bindparam("job_id")).order_by(JOBS.c.id)
_ROW_ON_CLUSTER = select(JOBS).where(JOBS.c.cluster == bindparam("cluster"), JOBS.c.job_id == bindparam("job_id"))


def wire_cluster(cluster: str) -> str | None:
    """The stored cluster as the API shows it: ``''`` (unknown) reads as ``null``."""
    return cluster or None


def is_postgres(conn: Connection) -> bool:
    """Whether the conn talks to PostgreSQL (SQLite serialises writers by itself)."""
    return conn.dialect.name == "postgresql"


def lock_job_id(conn: Connection, job_id: str) -> None:
    """Serialise writers of one job id until commit, so resolve-then-create cannot race."""
    if is_postgres(conn):
        pg_driver.execute(conn, pg_driver.LOCK_JOB_ID, {"namespace": JOB_LOCK, "job_id": job_id})


def _rows(conn: Connection, job_id: str) -> list[JobRow]:
    if is_postgres(conn):
        return [dict(row) for row in conn.execute(_ROWS_OF_JOB_ID, {"job_id": job_id}).mappings()]
    return sqlite_driver.job_rows(conn, job_id)


def _ambiguous(job_id: str, rows: list[JobRow], how: str) -> Conflict:
    clusters = sorted(wire_cluster(r["cluster"]) or "" for r in rows)
    return Conflict(
        f"job {job_id} exists on several clusters ({', '.join(clusters)}); say which with {how}",
        clusters=clusters,
    )


def find_for_write(conn: Connection, job_id: str, cluster: str | None, *,
                   prefetch: pg_driver.Query | None = None) -> JobRow | None:
    """The row a write lands on, as stored (see ``claim`` for a cluster-less one).

    Takes the job id's lock first, so until commit no other writer can create a row
    this one did not see. Returns None when the write should create a new row for
    ``(cluster or '', job_id)``. On PostgreSQL ``prefetch`` runs under the lock in the
    same round trip; SQLite leaves it unrun (its ``rows`` None).
    """
    # On SQLite, BEGIN IMMEDIATE already made this the only writer.
    rows = pg_driver.locked_job_rows(conn, JOB_LOCK, job_id, prefetch) if is_postgres(conn) else _rows(conn, job_id)
    bare = next((r for r in rows if r["cluster"] == NO_CLUSTER), None)
    if cluster:
        exact = next((r for r in rows if r["cluster"] == cluster), None)
        return exact if exact is not None else bare
    if bare is not None:
        return bare
    if len(rows) > 1:
        raise _ambiguous(job_id, rows, "the body's cluster (POST) or metadata.cluster (PUT)")
    return rows[0] if rows else None


def claim(row: JobRow, cluster: str | None) -> None:
    """A write that names a cluster gives it to the cluster-less row it landed on."""
    if cluster and row["cluster"] == NO_CLUSTER:
        row["cluster"] = cluster


def find_for_read(conn: Connection, job_id: str, cluster: str | None) -> JobRow:
    """The row a read or delete means, by the same rule as a write without a cluster."""
    if cluster:
        rows = [dict(row) for row in conn.execute(_ROW_ON_CLUSTER, {"cluster": cluster, "job_id": job_id}).mappings()]
    else:
        rows = _rows(conn, job_id)
    return pick_for_read(rows, job_id, cluster)


def pick_for_read(rows: list[JobRow], job_id: str, cluster: str | None) -> JobRow:
    """The row a read means among ``rows``: the job id's rows, or with ``cluster`` its row there (if any)."""
    if cluster:
        if not rows:
            raise NotFound(f"job {job_id} not found on cluster {cluster}")
        return rows[0]
    bare = next((r for r in rows if r["cluster"] == NO_CLUSTER), None)
    if bare is not None:
        return bare
    if len(rows) > 1:
        raise _ambiguous(job_id, rows, "?cluster=")
    if not rows:
        raise NotFound(f"job {job_id} not found")
    return rows[0]
