"""Lifecycle events: the append rule and the cursor feeds."""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection
from sqlalchemy import select

from collector.contract import JobEventRecord
from collector.models import JobEvent
from collector.store import pg_driver
from collector.store import sqlite_driver
from collector.store.core import table
from collector.store.identity import JOBS
from collector.store.identity import JobRow
from collector.store.identity import is_postgres
from collector.store.identity import wire_cluster

EVENTS = table(JobEvent)
_RECORD_COLUMNS = (EVENTS.c.id, JOBS.c.job_id, JOBS.c.cluster, EVENTS.c.status, EVENTS.c.stage, EVENTS.c.message,
                   EVENTS.c.created_at, EVENTS.c.credential)


def _record_of(row: Mapping[Any, Any]) -> JobEventRecord:
    # A row of _RECORD_COLUMNS (as _FEED_SELECT reads them).
    return JobEventRecord(**{**row, "cluster": wire_cluster(row["cluster"])})


def append_if_changed(
    conn: Connection, job: JobRow, before: tuple[str, str | None, str | None] | None, created_at: dt.datetime,
    credential: str | None = None,
) -> JobEventRecord | None:
    """Append an event iff the job's (status, stage, message) changed from ``before``.

    Every change of that triple appends an event carrying it, so a job row's triple is
    always its last event's: comparing with the row as it was saves reading the event.
    ``before`` is None for a row that was just created.
    """
    current = (job["status"], job["stage"], job["message"])
    if before == current:
        return None
    # SQLite: BEGIN IMMEDIATE admits one writer at a time, so AUTOINCREMENT ids commit in
    # order. PostgreSQL appends through pg_driver.SAVE_EXISTING instead.
    values = dict(job_pk=job["id"], status=current[0], stage=current[1], message=current[2], created_at=created_at,
                  credential=credential)
    event_id = sqlite_driver.insert_event(conn, values)
    return record(job, event_id, created_at, credential)


def stored(job: JobRow, event: dict[str, Any]) -> JobEventRecord:
    """The wire record of a stored event of ``job`` (a ``job_events`` row)."""
    return JobEventRecord(
        id=event["id"],
        job_id=job["job_id"],
        cluster=wire_cluster(job["cluster"]),
        status=event["status"],
        stage=event["stage"],
        message=event["message"],
        created_at=event["created_at"],
        credential=event["credential"],
    )


def record(job: JobRow, event_id: int, created_at: dt.datetime, credential: str | None = None) -> JobEventRecord:
    """The wire record of the event just appended for ``job``."""
    return JobEventRecord(
        id=event_id,
        job_id=job["job_id"],
        cluster=wire_cluster(job["cluster"]),
        status=job["status"],
        stage=job["stage"],
        message=job["message"],
        created_at=created_at,
        credential=credential,
    )


def job_events(conn: Connection, job_pk: int, *, after: int = 0, limit: int | None = None) -> list[JobEventRecord]:
    """One job's events with ``id > after``, oldest first.

    No horizon: a job's events commit in id order (store/event_ids.py), so a job's
    timeline shows its newest event as soon as the write that made it has answered.
    """
    query = (
        select(*_RECORD_COLUMNS)
        .join(JOBS, JOBS.c.id == EVENTS.c.job_pk)
        .where(EVENTS.c.job_pk == job_pk, EVENTS.c.id > after)
        .order_by(EVENTS.c.id)
    )
    if limit is not None:
        query = query.limit(limit)
    return [_record_of(row) for row in conn.execute(query).mappings()]


# The feed's columns as fixed text, for both databases' drivers.
_FEED_SELECT = ("SELECT e.id, j.job_id, j.cluster, e.status, e.stage, e.message, e.created_at, e.credential "
                "FROM job_events e JOIN jobs j ON j.id = e.job_pk")


def _feed_statement(by_job: bool, by_cluster: bool) -> pg_driver.Statement:
    # One statement per filter combination, so each keeps a plan of its own.
    where = ["e.id > %(after)s", "e.id < collector_feed_horizon()"]
    where += ["j.job_id = %(job_id)s"] if by_job else []
    where += ["j.cluster = %(cluster)s"] if by_cluster else []
    return pg_driver.statement(f"collector_feed_{int(by_job)}{int(by_cluster)}",
                               f"{_FEED_SELECT} WHERE {' AND '.join(where)} ORDER BY e.id LIMIT %(limit)s")


# The feed on PostgreSQL: one prepared statement, with BEGIN and COMMIT in its round trip
# (three round trips through SQLAlchemy, whose per-execution work cost more than the read).
_FEEDS = {(by_job, by_cluster): _feed_statement(by_job, by_cluster) for by_job in (False, True)
          for by_cluster in (False, True)}


def feed(
    conn: Connection,
    *,
    after: int,
    limit: int,
    job_id: str | None = None,
    cluster: str | None = None,
) -> list[JobEventRecord]:
    """Events across every job with ``id > after``, oldest first, optionally filtered.

    On PostgreSQL, only ids below the horizon (store/event_ids.py): a cursor never skips.
    """
    if is_postgres(conn):
        statement = _FEEDS[job_id is not None, cluster is not None]
        params = {"after": after, "limit": limit, "job_id": job_id, "cluster": cluster}
        (rows,) = pg_driver.execute_all(conn, [pg_driver.Query(statement, params)], commit=True)
        return [_record_of(pg_driver.in_utc(row)) for row in rows]
    # SQLite: every committed id is readable (no horizon).
    filters = {"j.job_id": job_id, "j.cluster": cluster}
    values = [value for value in filters.values() if value is not None]
    read = _sqlite_feed(tuple(name for name, value in filters.items() if value is not None))
    return [_record_of(row) for row in sqlite_driver.fetch(conn, read, [after, *values, limit])]


@functools.cache
def _sqlite_feed(filters: tuple[str, ...]) -> sqlite_driver.Read:
    where = " AND ".join(["e.id > ?", *(f"{name} = ?" for name in filters)])
    return sqlite_driver.read(f"{_FEED_SELECT} WHERE {where} ORDER BY e.id LIMIT ?",
                              list(_RECORD_COLUMNS))


def next_cursor(events: list[JobEventRecord], after: int) -> int | None:
    """The last id returned, else the cursor passed in, else null on an empty feed."""
    if events:
        return events[-1].id
    return after if after > 0 else None
