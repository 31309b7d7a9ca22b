"""Server-sent event streams: every job event as it commits, resumable by event id."""

from __future__ import annotations

import random
from collections.abc import Iterator

from flask import Blueprint
from flask import Response
from flask import current_app
from flask import request

from collector import fanout
from collector.api import checked_job_id
from collector.api import parse_query
from collector.api.queries import MAX_CURSOR
from collector.api.queries import JobStreamQuery
from collector.api.queries import StreamQuery
from collector.db import transaction
from collector.errors import APIError
from collector.errors import Unprocessable
from collector.openapi import EVENT_STREAM
from collector.openapi import SSE
from collector.openapi import operation
from collector.settings import Settings
from collector.store import jobs as job_store

bp = Blueprint("streams", __name__)
RESUME = {"Last-Event-ID": "resume after this event id (wins over ?after=)"}

STREAM_HEADERS = {
    # no-transform: a compressing proxy would hold events back to fill its blocks.
    "Cache-Control": "no-cache, no-transform",
    # nginx buffers proxied responses unless told otherwise, per response.
    "X-Accel-Buffering": "no",
}


@bp.get("/api/events/stream")
@operation(query=StreamQuery, headers=RESUME, responses={200: {EVENT_STREAM: SSE}})
def all_events() -> Response:
    """Every job's events as they commit, optionally filtered by job id, cluster and status."""
    query = parse_query(StreamQuery)
    where = fanout.Filter(job_id=query.job_id, cluster=query.cluster, status=_status(query))
    return _stream(where, query.after)


@bp.get("/api/jobs/<job_id>/events/stream")
@operation(query=JobStreamQuery, headers=RESUME, responses={200: {EVENT_STREAM: SSE}}, errors=(404, 409))
def job_events(job_id: str) -> Response:
    """One job's events as they commit."""
    query = parse_query(JobStreamQuery)
    job_id = checked_job_id(job_id)
    job_pk, _cluster = transaction(lambda conn: job_store.resolve(conn, job_id, query.cluster))
    return _stream(fanout.Filter(job_pk=job_pk, status=_status(query)), query.after)


def _status(query: JobStreamQuery) -> str | None:
    return query.status.value if query.status else None


def _resume_from(after: int | None) -> int | None:
    # A reconnecting EventSource repeats its original URL (with any ?after=) and adds
    # Last-Event-ID, which is newer, so the header wins.
    header = request.headers.get("Last-Event-ID", "").strip()
    if not header:
        return after
    if not (header.isascii() and header.isdigit()) or int(header) > MAX_CURSOR:
        raise Unprocessable(f"Last-Event-ID must be an event id (an integer from 0 to {MAX_CURSOR}), "
                            f"got {header[:40]!r}")
    return int(header)


def open_stream(hub: fanout.Hub) -> int:
    """Take one of the process's stream slots and return the feed's live edge; 503 when neither is to be had."""
    try:
        hub.acquire()
    except fanout.Unavailable as exc:
        raise APIError(f"{exc}; retry shortly", status=503, headers={"Retry-After": "5"}) from None
    try:
        return hub.live_edge()
    except fanout.Unavailable as exc:
        hub.release()
        raise APIError(str(exc), status=503, headers={"Retry-After": "5"}) from None


def stream_response(hub: fanout.Hub, body: Iterator[bytes]) -> Response:
    """The response that sends ``body`` and gives the slot back when it ends."""
    response = Response(body, mimetype="text/event-stream", headers=STREAM_HEADERS)
    # Not a finally in the generator: one that never started never runs it.
    response.call_on_close(hub.release)
    return response


def lifetime() -> float:
    """How long the stream about to open may last."""
    # Jittered, so streams opened together (after a deploy, say) do not all reconnect together.
    settings: Settings = current_app.config["COLLECTOR_SETTINGS"]
    return settings.stream_max_lifetime_s * random.uniform(0.9, 1.0)


def _stream(where: fanout.Filter, after: int | None) -> Response:
    hub = fanout.get_hub()
    cursor = _resume_from(after)
    edge = open_stream(hub)
    body = fanout.frames(hub, edge if cursor is None else cursor, where, current_app.config["COLLECTOR_SETTINGS"],
                         lifetime=lifetime())
    return stream_response(hub, body)
