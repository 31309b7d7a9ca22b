"""Per-(cluster, status) job counts: the list's totals without COUNT(*) over every job."""

from __future__ import annotations

from sqlalchemy import Connection
from sqlalchemy import delete
from sqlalchemy import func
from sqlalchemy import insert
from sqlalchemy import select
from sqlalchemy import text

from collector.models import Job
from collector.models import JobCount
from collector.store.core import table

COUNTS = table(JobCount)
JOBS = table(Job)

Key = tuple[str, str]

_ADD = text(
    "INSERT INTO job_counts (cluster, status, jobs) VALUES (:cluster, :status, :delta) "
    "ON CONFLICT (cluster, status) DO UPDATE SET jobs = job_counts.jobs + excluded.jobs"
)


def move(conn: Connection, old: Key | None, new: Key | None) -> None:
    """Count a job under ``new`` instead of ``old`` (None: created, or deleted)."""
    if old == new:
        return
    changes = {key: delta for key, delta in ((old, -1), (new, 1)) if key is not None}
    # Always in key order: two writers moving jobs between the same pair of rows in
    # opposite directions would otherwise each hold one row and wait for the other.
    for (cluster, status), delta in sorted(changes.items()):
        conn.execute(_ADD, {"cluster": cluster, "status": status, "delta": delta})


def total(conn: Connection, *, status: str | None = None, cluster: str | None = None) -> int:
    """How many jobs match the list filters."""
    query = select(func.coalesce(func.sum(COUNTS.c.jobs), 0))
    if status is not None:
        query = query.where(COUNTS.c.status == status)
    if cluster is not None:
        query = query.where(COUNTS.c.cluster == cluster)
    return int(conn.execute(query).scalar_one())


def by_cluster(conn: Connection) -> dict[str, dict[str, int]]:
    """Every cluster that holds a job (``''`` for none known) and its non-zero counts by status."""
    rows = conn.execute(select(COUNTS.c.cluster, COUNTS.c.status, COUNTS.c.jobs).where(COUNTS.c.jobs > 0))
    found: dict[str, dict[str, int]] = {}
    for cluster, status, jobs in rows:
        found.setdefault(cluster, {})[status] = int(jobs)
    return found


def recount(conn: Connection) -> None:
    """Rebuild every count from the jobs table (after edits made behind the collector's back)."""
    conn.execute(delete(COUNTS))
    grouped = select(JOBS.c.cluster, JOBS.c.status, func.count()).group_by(JOBS.c.cluster, JOBS.c.status)
    conn.execute(insert(COUNTS).from_select(["cluster", "status", "jobs"], grouped))
