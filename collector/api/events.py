"""``/api/events``: the global event feed across every job and cluster."""

from __future__ import annotations

from flask import Blueprint
from flask import Response

from collector.api import parse_query
from collector.api import respond
from collector.api.queries import FeedQuery
from collector.contract import EventFeedResponse
from collector.db import transaction
from collector.openapi import operation
from collector.store import events as event_store

bp = Blueprint("events", __name__, url_prefix="/api/events")


@bp.get("")
@operation(query=FeedQuery, responses={200: EventFeedResponse})
def feed() -> Response:
    """Events after a cursor, optionally for one job id and/or one cluster."""
    query = parse_query(FeedQuery)
    events = transaction(
        lambda conn: event_store.feed(
            conn, after=query.after, limit=query.limit, job_id=query.job_id, cluster=query.cluster
        )
    )
    return respond(EventFeedResponse(events=events, next_cursor=event_store.next_cursor(events, query.after)))
