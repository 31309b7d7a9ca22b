"""``/api/jobs``: submit, update, read, list and delete jobs, and one job's event feed."""

from __future__ import annotations

import logging

from flask import Blueprint
from flask import Response
from sqlalchemy import Connection

from collector import fanout
from collector import metrics
from collector.api import checked_job_id
from collector.api import parse_body
from collector.api import parse_query
from collector.api import respond
from collector.api import write_cluster
from collector.api import writer
from collector.api.queries import ClusterQuery
from collector.api.queries import EventQuery
from collector.api.queries import JobListQuery
from collector.contract import DeleteResponse
from collector.contract import JobCreatePayload
from collector.contract import JobDetail
from collector.contract import JobEventListResponse
from collector.contract import JobEventRecord
from collector.contract import JobListResponse
from collector.contract import JobResponse
from collector.contract import JobUpdatePayload
from collector.contract import format_timestamp
from collector.db import transaction
from collector.openapi import JSON
from collector.openapi import operation
from collector.store import events as event_store
from collector.store import job_list
from collector.store import jobs as job_store
from collector.store.jobs import WriteResult

bp = Blueprint("jobs", __name__, url_prefix="/api/jobs")
log = logging.getLogger("collector.jobs")


def _written(result: WriteResult, status: int) -> Response:
    if result.event is not None:
        # This process's streams read it now; on PostgreSQL the hub announces it to the others.
        fanout.get_hub().poke(result.event.id)
        metrics.event_appended()
        event = result.event
        log.info(
            "job %s%s -> %s/%s: %s",
            f"{result.cluster}/" if result.cluster else "",
            result.job_id,
            event.status,
            event.stage or "-",
            event.message or "",
        )
    return respond(JobResponse(job_id=result.job_id, status=result.status, cluster=result.cluster), status)


@bp.post("")
@operation(body={JSON: JobCreatePayload}, responses={201: JobResponse}, errors=(409,))
def create_job() -> Response:
    """Record a submitted job; a repeat completes identity and never rewinds status."""
    payload = parse_body(JobCreatePayload)
    cluster, credential = write_cluster(payload.cluster), writer()
    return _written(transaction(lambda conn: job_store.submit(conn, payload, cluster=cluster, credential=credential),
                                write=True), 201)


@bp.put("/<job_id>")
@operation(body={JSON: JobUpdatePayload}, responses={200: JobResponse}, errors=(409,))
def update_job(job_id: str) -> Response:
    """Apply a lifecycle update, creating a placeholder for a job never POSTed."""
    checked_job_id(job_id)
    payload = parse_body(JobUpdatePayload)
    cluster, credential = write_cluster(payload.reported_cluster()), writer()
    result = transaction(lambda conn: job_store.update(conn, job_id, payload, cluster=cluster, credential=credential),
                         write=True)
    if result.late:
        # The reporter gets its 200 either way; the log shows which PUTs ran behind newer ones.
        log.info("job %s%s: late update to %s stamped %s left it %s",
                 f"{result.cluster}/" if result.cluster else "", result.job_id, payload.status.value,
                 format_timestamp(payload.updated_at), result.status)
    return _written(result, 200)


@bp.get("/<job_id>")
@operation(query=ClusterQuery, responses={200: JobDetail}, errors=(404, 409))
def get_job(job_id: str) -> Response:
    """One job with its events."""
    query = parse_query(ClusterQuery)
    job_id = checked_job_id(job_id)
    return respond(transaction(lambda conn: job_store.detail(conn, job_id, query.cluster)))


@bp.get("")
@operation(query=JobListQuery, responses={200: JobListResponse})
def list_jobs() -> Response:
    """Jobs newest first (or as ``sort`` and ``order`` say), filtered and searched, one page at a time."""
    query = parse_query(JobListQuery)
    found = transaction(
        lambda conn: job_list.page(
            conn,
            page=query.page,
            per_page=query.per_page,
            status=query.status.value if query.status else None,
            cluster=query.cluster,
            q=query.q,
            sort=query.sort.value,
            descending=query.descending,
        )
    )
    return respond(JobListResponse(jobs=found.jobs, total=found.total, page=query.page, per_page=query.per_page,
                                   total_exact=found.exact))


@bp.get("/<job_id>/events")
@operation(query=EventQuery, responses={200: JobEventListResponse}, errors=(404, 409))
def job_events(job_id: str) -> Response:
    """One job's events after a cursor."""
    query = parse_query(EventQuery)
    job_id = checked_job_id(job_id)

    def read(conn: Connection) -> tuple[str | None, list[JobEventRecord]]:
        job_pk, cluster = job_store.resolve(conn, job_id, query.cluster)
        return cluster, event_store.job_events(conn, job_pk, after=query.after, limit=query.limit)

    cluster, events = transaction(read)
    return respond(
        JobEventListResponse(
            job_id=job_id, cluster=cluster, events=events, next_cursor=event_store.next_cursor(events, query.after)
        )
    )


@bp.delete("/<job_id>")
@operation(query=ClusterQuery, responses={200: DeleteResponse}, errors=(404, 409))
def delete_job(job_id: str) -> Response:
    """Remove a job and everything stored under it."""
    query = parse_query(ClusterQuery)
    job_id = checked_job_id(job_id)
    cluster = transaction(lambda conn: job_store.remove(conn, job_id, query.cluster), write=True)
    log.info("job %s%s deleted", f"{cluster}/" if cluster else "", job_id)
    return respond(DeleteResponse(deleted=True, job_id=job_id, cluster=cluster))
