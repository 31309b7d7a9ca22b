"""The PostgreSQL write path's statements, run on the driver connection itself.

A lifecycle PUT is dominated by per-statement overhead, and on this path SQLAlchemy's
share of it (compilation lookup, bind and result processing) was larger than the
driver's. These statements are fixed text, so they skip it: they run through psycopg on
the very DBAPI connection, inside the transaction SQLAlchemy opened (docs/performance.md
has the figures). Everything else, and all of SQLite, goes through SQLAlchemy.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator
from typing import Any
from typing import cast

import psycopg
import psycopg.errors
from psycopg import pq
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from collector.models import Job
from collector.models import JSONDocument
from collector.models import UTCDateTime
from collector.store.core import table

JOBS = table(Job)
_COLUMNS = [c.name for c in JOBS.c]
_MUTABLE = [name for name in _COLUMNS if name != "id"]
_TIMESTAMPS = frozenset(c.name for c in JOBS.c if isinstance(c.type, UTCDateTime))
_JSON = frozenset(c.name for c in JOBS.c if c.type is JSONDocument)

LOCK_JOB_ID = "SELECT pg_advisory_xact_lock(%(namespace)s, hashtext(%(job_id)s))"
# The lock, then the rows, in one statement (revision 0009): the function's SELECT takes
# its snapshot once the lock is held, so it sees whatever the previous holder committed.
LOCKED_ROWS_OF_JOB_ID = f"SELECT {', '.join(_COLUMNS)} FROM collector_locked_rows(%(namespace)s, %(job_id)s)"

_UPDATED = "updated AS (UPDATE jobs SET {} WHERE id = %(pk)s AND %(changed)s)".format(
    ", ".join(f'"{name}" = %({name})s' for name in _MUTABLE)
)
# Counts go to one of counts.STRIPES rows per (cluster, status), picked per write, so
# concurrent writes moving jobs between the same statuses rarely hold the same row lock
# across their commits. Rows are locked in key order (ORDER BY), so no two writers wait
# on each other in a cycle. Zero deltas are filtered out.
_COUNTED = (
    "counted AS (INSERT INTO job_count_stripes (cluster, status, stripe, jobs) "
    "SELECT v.cluster, v.status, %(stripe)s::smallint, v.delta FROM "
    "(VALUES (%(old_cluster)s, %(old_status)s, %(old_delta)s::bigint), "
    "(%(new_cluster)s, %(new_status)s, %(new_delta)s::bigint)) AS v (cluster, status, delta) "
    "WHERE v.delta <> 0 ORDER BY v.cluster, v.status "
    "ON CONFLICT (cluster, status, stripe) DO UPDATE SET jobs = job_count_stripes.jobs + excluded.jobs)"
)
# No lock orders the feed and nothing notifies inside the transaction: the event's id is
# its transaction's id (the column default, store/event_ids.py) and readers stop at the
# oldest transaction still running, so writers commit in parallel and PostgreSQL flushes
# their commits together. (A NOTIFY here would take NOTIFY's own cluster-wide lock across
# the commit and serialise every writer again; each process's stream hub announces its
# writes after they commit instead, collector/fanout.py.)
EVENT_CHANNEL = "collector_events"
SAVE_WITH_EVENT = (
    f"WITH {_UPDATED}, "
    "event AS (INSERT INTO job_events (job_pk, status, stage, message, created_at, credential) "
    "VALUES (%(pk)s, %(status)s, %(stage)s, %(message)s, %(created_at)s, %(credential)s) RETURNING id), "
    + _COUNTED
    + " SELECT id FROM event"
)
SAVE_WITHOUT_EVENT = f"WITH {_UPDATED}, " + _COUNTED + " SELECT NULL"
# A new job: its row, its first event and its count in one statement, so a POST that
# creates a job is two round trips like any other write. The event's job_pk comes from
# the row inserted in the same statement (RETURNING), and both ids come back.
SAVE_NEW_JOB = (
    "WITH inserted AS (INSERT INTO jobs ({}) VALUES ({}) RETURNING id), ".format(
        ", ".join(f'"{name}"' for name in _MUTABLE), ", ".join(f"%({name})s" for name in _MUTABLE)
    )
    + "event AS (INSERT INTO job_events (job_pk, status, stage, message, created_at, credential) "
    "SELECT id, %(status)s, %(stage)s, %(message)s, %(created_at)s, %(credential)s FROM inserted "
    "RETURNING id, job_pk), "
    + _COUNTED
    + " SELECT id, job_pk FROM event"
)


# SQLSTATE classes of a session the server has ended: connection exceptions (08) and
# operator intervention short of a cancel (57P01 admin shutdown, 57P02 crash, 57P03...).
_DEAD_STATES = ("08", "57P")


def kills_connection(exc: BaseException) -> bool:
    """Whether ``exc`` leaves its psycopg connection unusable, so the transaction must move to another.

    ``closed``/``broken`` are not enough: when the server terminates a backend, libpq may
    report the FATAL message (or, in pipeline mode, "cannot exit pipeline mode while
    busy") before it has seen the socket close, and the connection still looks healthy.
    """
    if not isinstance(exc, psycopg.OperationalError) or isinstance(exc, psycopg.errors.PipelineAborted):
        return False
    # Errors raised by libpq or psycopg themselves (a lost socket, a pipeline left busy)
    # carry no SQLSTATE and leave the session in an unknown state: never reuse it.
    return exc.sqlstate is None or exc.sqlstate.startswith(_DEAD_STATES)


def is_dead(driver: psycopg.Connection, exc: BaseException) -> bool:
    """Whether ``driver`` can no longer be used after ``exc``."""
    return driver.closed or driver.broken or kills_connection(exc)


@contextlib.contextmanager
def _driver(conn: Connection, sql: str) -> Iterator[psycopg.Connection[Any]]:
    """The transaction's psycopg connection; its errors are raised as SQLAlchemy's.

    As if SQLAlchemy had run the statement, so the error handlers and the dead-connection
    replay (db.Database.run) see one kind of error.
    """
    # The psycopg dialect's DBAPI connection is psycopg's own (SQLAlchemy types it as Any).
    driver = cast("psycopg.Connection[Any]", conn.connection.driver_connection)
    try:
        yield driver
    except psycopg.Error as exc:
        dead = is_dead(driver, exc)
        if dead:
            conn.invalidate(exc)
        raise DBAPIError.instance(sql, None, exc, psycopg.Error, hide_parameters=True,
                                  connection_invalidated=dead, dialect=conn.dialect) from exc


def execute(conn: Connection, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Run ``sql`` in the transaction; rows come back as dicts."""
    with _driver(conn, sql) as driver, driver.cursor(row_factory=dict_row) as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall() if cursor.description else []


def execute_and_commit(conn: Connection, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Run the transaction's last statement and its COMMIT in one round trip (pipeline mode).

    A writer holds its job's lock and its count rows from the statement to COMMIT. Sent
    separately, the COMMIT waits for this thread to get the GIL back (up to the 5 ms
    switch interval under load) while writers of the same job or count row queue behind
    it; pipelined, the server commits as soon as the statement is done. SQLAlchemy's own
    commit that follows finds the transaction closed and sends nothing.

    COMMIT goes as a statement, not through ``driver.commit()``: in a pipeline that syncs
    at once, and leaving the pipeline then syncs again, a second round trip for nothing.
    """
    with _driver(conn, sql) as driver, driver.cursor(row_factory=dict_row) as cursor, \
            driver.cursor() as commit:
        with driver.pipeline():
            cursor.execute(sql, params)
            commit.execute(b"COMMIT")
        # Leaving the pipeline block has waited for both results.
        return cursor.fetchall() if cursor.description else []


def locked_job_rows(conn: Connection, namespace: int, job_id: str) -> list[dict[str, Any]]:
    """Open the transaction, take the job id's lock and read its rows, in one round trip.

    One statement for the lock and the read (psycopg spends more per pipelined statement
    than the server does on either, docs/performance.md), pipelined behind our own BEGIN:
    the BEGIN psycopg sends by itself waits for its answer before anything else goes.
    """
    with _driver(conn, LOCKED_ROWS_OF_JOB_ID) as driver, driver.cursor() as begin, \
            driver.cursor(row_factory=dict_row) as rows:
        opens = driver.info.transaction_status == pq.TransactionStatus.IDLE and not driver.autocommit
        if opens:
            driver.autocommit = True  # psycopg sends no BEGIN of its own: ours goes in the pipeline
        try:
            with driver.pipeline():
                if opens:
                    begin.execute(b"BEGIN")
                rows.execute(LOCKED_ROWS_OF_JOB_ID, {"namespace": namespace, "job_id": job_id})
        finally:
            if opens:
                # Inside the transaction the public setter refuses; the flag only says whether
                # psycopg opens transactions itself, which it must again for the next one.
                driver._autocommit = False
        # Leaving the pipeline block has waited for both results.
        return job_rows(rows.fetchall())


def job_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows as SQLAlchemy would give them: timestamps in UTC."""
    for row in rows:
        for name in _TIMESTAMPS:
            if row[name] is not None:
                row[name] = row[name].astimezone(dt.UTC)
    return rows


def row_params(row: dict[str, Any]) -> dict[str, Any]:
    """The job's columns as statement parameters (JSON documents wrapped for jsonb)."""
    return {name: (Jsonb(row[name]) if name in _JSON and row[name] is not None else row[name]) for name in _MUTABLE}
