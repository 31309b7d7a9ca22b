"""``/api/clusters``: the clusters the collector knows, with their jobs by status."""

from __future__ import annotations

from flask import Blueprint

from collector.api import respond
from collector.contract import ClusterCounts
from collector.contract import ClusterListResponse
from collector.contract import JobStatus
from collector.db import transaction
from collector.openapi import operation
from collector.store import counts
from collector.store.identity import wire_cluster

bp = Blueprint("clusters", __name__, url_prefix="/api/clusters")
_LIFECYCLE = [status.value for status in JobStatus]


def _in_lifecycle_order(statuses: dict[str, int]) -> dict[str, int]:
    known = {status: statuses[status] for status in _LIFECYCLE if status in statuses}
    return {**known, **{status: n for status, n in sorted(statuses.items()) if status not in known}}


@bp.get("")
@operation(responses={200: ClusterListResponse})
def list_clusters():
    """Every cluster holding a job, by name, with its job counts by status (jobs with no known cluster: null, last)."""
    # From the maintained per-(cluster, status) counts: the cost does not grow with the jobs.
    found = transaction(counts.by_cluster)
    # Sorted here, not in SQL: code point order whatever the database's collation.
    names = sorted(found, key=lambda name: (name == "", name))
    return respond(ClusterListResponse(clusters=[
        ClusterCounts(cluster=wire_cluster(name), total=sum(found[name].values()),
                      statuses=_in_lifecycle_order(found[name]))
        for name in names
    ]))
