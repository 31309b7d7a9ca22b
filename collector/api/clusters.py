"""``/api/clusters``: cluster health from the probe, job counts and active jobs; the probe's report."""

from __future__ import annotations

import datetime as dt

from flask import Blueprint
from flask import Response
from flask import current_app
from pydantic import TypeAdapter
from pydantic import ValidationError
from sqlalchemy import Connection

from collector import health
from collector.api import parse_body
from collector.api import respond
from collector.api import write_cluster
from collector.cluster_contract import ClusterListResponse
from collector.cluster_contract import ClusterStatusReport
from collector.cluster_contract import ClusterStatusResponse
from collector.cluster_contract import Health
from collector.contract import Identifier
from collector.db import transaction
from collector.errors import Unprocessable
from collector.errors import validation_detail
from collector.janitor import get_janitor
from collector.openapi import JSON
from collector.openapi import operation
from collector.store import clusters as cluster_store

bp = Blueprint("clusters", __name__, url_prefix="/api/clusters")
# A cluster in a path follows the job id's rule: no slash, no control character.
_CLUSTER = TypeAdapter(Identifier)


def checked_cluster(cluster: str) -> str:
    """The path's cluster name, held to the job id's rule."""
    try:
        return _CLUSTER.validate_python(cluster)
    except ValidationError as exc:
        detail, errors = validation_detail(exc, "path", name="cluster")
        raise Unprocessable(detail, extra={"errors": errors}) from None


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@bp.get("")
@operation(responses={200: ClusterListResponse})
def list_clusters() -> Response:
    """Every cluster holding a job or probed: health, job counts by status and active jobs (no cluster: null, last)."""
    return respond(ClusterListResponse(clusters=transaction(lambda conn: cluster_store.states(conn, _now()))))


def _status_response(cluster: str, now: dt.datetime) -> ClusterStatusResponse:
    def read(conn: Connection) -> ClusterStatusResponse:
        (state,) = cluster_store.states(conn, now, cluster)
        return ClusterStatusResponse(**dict(state), watch=cluster_store.watch(conn, cluster))

    return transaction(read)


@bp.get("/<cluster>/status")
@operation(responses={200: ClusterStatusResponse})
def cluster_status(cluster: str) -> Response:
    """One cluster as GET /api/clusters lists it, plus the job ids its probe should ask Slurm about."""
    return respond(_status_response(checked_cluster(cluster), _now()))


@bp.put("/<cluster>/status")
@operation(body={JSON: ClusterStatusReport}, responses={200: ClusterStatusResponse})
def report_status(cluster: str) -> Response:
    """Record what a probe of the cluster saw (``collector probe``); the collector derives the health."""
    cluster = checked_cluster(cluster)
    write_cluster(cluster)
    report = parse_body(ClusterStatusReport)
    status, detail = health.derive(report.error, report.nodes, report.partitions)
    now = _now()

    def write(conn: Connection) -> None:
        cluster_store.save_probe(conn, cluster, report, Health(status), detail, now)
        cluster_store.observe_jobs(conn, cluster, report, now)

    transaction(write, write=True)
    # Right away rather than at the next periodic sweep: this report may be what makes a job stale.
    get_janitor(current_app).sweep(now)
    return respond(_status_response(cluster, now))
