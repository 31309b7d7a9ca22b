"""Per-cluster activity for monitoring: when each cluster last reported."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import Connection
from sqlalchemy import func
from sqlalchemy import select

from collector.models import Job
from collector.store.core import table
from collector.store.counts import ALL_COUNTS
from collector.store.identity import NO_CLUSTER

JOBS = table(Job)
# Jobs per cluster looked at: its newest by submission, read backwards along
# ix_jobs_cluster_submitted_at_id. No index orders a cluster's jobs by updated_at, and a
# GROUP BY over every job would grow with the table; a job reports while it runs,
# which is soon after it was submitted, so its last report is among these.
RECENT_JOBS = 100


def last_reports(conn: Connection) -> list[tuple[str, dt.datetime]]:
    """Each named cluster with the newest ``updated_at`` among its most recently submitted jobs."""
    # The counts hold rows per (cluster, status): the cluster list without touching jobs.
    clusters = (
        select(ALL_COUNTS.c.cluster)
        .where(ALL_COUNTS.c.cluster != NO_CLUSTER)
        .group_by(ALL_COUNTS.c.cluster, ALL_COUNTS.c.status)
        .having(func.sum(ALL_COUNTS.c.jobs) > 0)
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
