"""Per-cluster activity for monitoring: when each cluster last reported."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import Connection
from sqlalchemy import func
from sqlalchemy import select

from collector.models import Job
from collector.models import JobCount
from collector.store.core import table
from collector.store.identity import NO_CLUSTER

JOBS = table(Job)
COUNTS = table(JobCount)
# Jobs per cluster looked at: its newest by submission, read backwards along
# ix_jobs_cluster_submitted_at_id. No index orders a cluster's jobs by updated_at, and a
# GROUP BY over every job would grow with the table; a job reports while it runs,
# which is soon after it was submitted, so its last report is among these.
RECENT_JOBS = 100


def last_reports(conn: Connection) -> list[tuple[str, dt.datetime]]:
    """Each named cluster with the newest ``updated_at`` among its most recently submitted jobs."""
    # job_counts holds a row per (cluster, status): the cluster list without touching jobs.
    clusters = (
        select(COUNTS.c.cluster)
        .where(COUNTS.c.jobs > 0, COUNTS.c.cluster != NO_CLUSTER)
        .distinct()
        .subquery("clusters")
    )
    recent = (
        select(JOBS.c.updated_at)
        .where(JOBS.c.cluster == clusters.c.cluster)
        .order_by(JOBS.c.submitted_at.desc(), JOBS.c.id.desc())
        .limit(RECENT_JOBS)
        .correlate(clusters)
        .subquery("recent")
    )
    newest = select(func.max(recent.c.updated_at)).scalar_subquery()
    query = select(clusters.c.cluster, newest.label("last_report")).order_by(clusters.c.cluster)
    return [(cluster, last) for cluster, last in conn.execute(query) if last is not None]
