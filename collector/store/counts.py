"""Per-(cluster, status) job counts: the list's totals without COUNT(*) over every job.

A count is its ``job_counts`` row plus its ``job_count_stripes`` rows. SQLite's single
writer and the rare writes (deletes, recounts) move ``job_counts``; PostgreSQL's write
path adds to one stripe picked per write (pg_driver._COUNTED), so concurrent writes
rarely share a row lock. Readers sum both, at most STRIPES + 1 rows per pair.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection
from sqlalchemy import Select
from sqlalchemy import bindparam
from sqlalchemy import delete
from sqlalchemy import func
from sqlalchemy import insert
from sqlalchemy import literal_column
from sqlalchemy import select
from sqlalchemy import text
from sqlalchemy import union_all

from collector.models import Job
from collector.models import JobCount
from collector.models import JobCountStripe
from collector.store import sqlite_driver
from collector.store.core import table
from collector.store.identity import is_postgres

COUNTS = table(JobCount)
STRIPED = table(JobCountStripe)
JOBS = table(Job)
# Enough that the writers of a busy server rarely pick the same row, few enough that a
# reader's sum stays a handful of rows.
STRIPES = 16
# Every count row, whichever table holds it: what readers select from.
ALL_COUNTS = union_all(
    select(COUNTS.c.cluster, COUNTS.c.status, COUNTS.c.jobs),
    select(STRIPED.c.cluster, STRIPED.c.status, STRIPED.c.jobs),
).subquery("counts")

Key = tuple[str, str]

_ADD_SQL = (
    "INSERT INTO job_counts (cluster, status, jobs) VALUES (:cluster, :status, :delta) "
    "ON CONFLICT (cluster, status) DO UPDATE SET jobs = job_counts.jobs + excluded.jobs"
)
_ADD = text(_ADD_SQL)


def move(conn: Connection, old: Key | None, new: Key | None) -> None:
    """Count a job under ``new`` instead of ``old`` (None: created, or deleted)."""
    if old == new:
        return
    changes = {key: delta for key, delta in ((old, -1), (new, 1)) if key is not None}
    # Always in key order: two writers moving jobs between the same pair of rows in
    # opposite directions would otherwise each hold one row and wait for the other.
    for (cluster, status), delta in sorted(changes.items()):
        params = {"cluster": cluster, "status": status, "delta": delta}
        if is_postgres(conn):
            conn.execute(_ADD, params)
        else:
            sqlite_driver.execute(conn, _ADD_SQL, params)


def total(conn: Connection, *, status: str | None = None, cluster: str | None = None) -> int:
    """How many jobs match the list filters."""
    params = {name: value for name, value in (("status", status), ("cluster", cluster)) if value is not None}
    return int(conn.execute(total_query(by_status=status is not None, by_cluster=cluster is not None),
                            params).scalar_one())


def total_query(*, by_status: bool, by_cluster: bool) -> Select[Any]:
    """The count of jobs (as ``total``) of a status and/or a cluster, bound as ``status`` and ``cluster``."""
    query = select(func.coalesce(func.sum(ALL_COUNTS.c.jobs), literal_column("0")).label("total"))
    if by_status:
        query = query.where(ALL_COUNTS.c.status == bindparam("status"))
    if by_cluster:
        query = query.where(ALL_COUNTS.c.cluster == bindparam("cluster"))
    return query


def by_cluster(conn: Connection) -> dict[str, dict[str, int]]:
    """Every cluster that holds a job (``''`` for none known) and its non-zero counts by status."""
    jobs = func.sum(ALL_COUNTS.c.jobs)
    rows = conn.execute(
        select(ALL_COUNTS.c.cluster, ALL_COUNTS.c.status, jobs)
        .group_by(ALL_COUNTS.c.cluster, ALL_COUNTS.c.status)
        .having(jobs > 0)
    )
    found: dict[str, dict[str, int]] = {}
    for cluster, status, count in rows:
        found.setdefault(cluster, {})[status] = int(count)
    return found


def recount(conn: Connection) -> None:
    """Rebuild every count from the jobs table (after edits made behind the collector's back)."""
    conn.execute(delete(STRIPED))
    conn.execute(delete(COUNTS))
    grouped = select(JOBS.c.cluster, JOBS.c.status, func.count()).group_by(JOBS.c.cluster, JOBS.c.status)
    conn.execute(insert(COUNTS).from_select(["cluster", "status", "jobs"], grouped))
