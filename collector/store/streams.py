"""The streams' reads: events after a cursor, each with its job as it is now."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection
from sqlalchemy import func
from sqlalchemy import select

from collector.contract import JobSummary
from collector.contract import StreamEvent
from collector.models import JobEvent
from collector.store import event_ids
from collector.store.core import table
from collector.store.identity import JOBS
from collector.store.identity import wire_cluster
from collector.store.jobs import SUMMARY_COLUMNS

EVENTS = table(JobEvent)
_SELECT = select(
    EVENTS.c.id,
    EVENTS.c.job_pk,
    EVENTS.c.status.label("event_status"),
    EVENTS.c.stage.label("event_stage"),
    EVENTS.c.message.label("event_message"),
    EVENTS.c.created_at.label("event_created_at"),
    EVENTS.c.credential,
    *(JOBS.c[name] for name in SUMMARY_COLUMNS),
).join(JOBS, JOBS.c.id == EVENTS.c.job_pk)
_NEWEST = select(func.coalesce(func.max(EVENTS.c.id), 0))


def by_id(conn: Connection, event_ids: list[int]) -> dict[int, StreamEvent]:
    """These events, each with its job as it is now; an id that is gone (its job deleted) is left out."""
    rows = conn.execute(_SELECT.where(EVENTS.c.id.in_(event_ids))).mappings()
    return {row["id"]: event_of(row) for row in rows}


def newest_id(conn: Connection) -> int:
    """The id of the newest readable event (0 for an empty feed): the live edge."""
    settled = event_ids.below_horizon(conn, EVENTS.c.id)
    newest: int = conn.execute(_NEWEST if settled is None else _NEWEST.where(settled)).scalar_one()
    return newest


def page(
    conn: Connection,
    *,
    after: int,
    limit: int,
    job_pk: int | None = None,
    job_id: str | None = None,
    cluster: str | None = None,
    status: str | None = None,
) -> list[tuple[int, StreamEvent]]:
    """Up to ``limit`` readable events with ``id > after``, oldest first, as (job primary key, event)."""
    query = _SELECT.where(EVENTS.c.id > after)
    if (settled := event_ids.below_horizon(conn, EVENTS.c.id)) is not None:
        query = query.where(settled)
    if job_pk is not None:
        query = query.where(EVENTS.c.job_pk == job_pk)
    if job_id is not None:
        query = query.where(JOBS.c.job_id == job_id)
    if cluster is not None:
        query = query.where(JOBS.c.cluster == cluster)
    if status is not None:
        query = query.where(EVENTS.c.status == status)
    rows = conn.execute(query.order_by(EVENTS.c.id).limit(limit)).mappings()
    return [(row["job_pk"], event_of(row)) for row in rows]


def event_of(row: Mapping[Any, Any]) -> StreamEvent:
    """The event of a row of ``_SELECT``'s columns (the claim of a webhook delivery reads the same)."""
    cluster = wire_cluster(row["cluster"])
    return StreamEvent(
        id=row["id"],
        job_id=row["job_id"],
        cluster=cluster,
        status=row["event_status"],
        stage=row["event_stage"],
        message=row["event_message"],
        created_at=row["event_created_at"],
        credential=row["credential"],
        job=JobSummary(**{**{name: row[name] for name in SUMMARY_COLUMNS}, "cluster": cluster}),
    )
