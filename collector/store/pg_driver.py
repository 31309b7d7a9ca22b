"""The PostgreSQL write path's statements, sent to libpq on the driver connection itself.

A lifecycle PUT is dominated by per-statement overhead, not by what the server does. On
this path SQLAlchemy's share of it (compilation lookup, bind and result processing) was
larger than the driver's, and psycopg's cursors and pipeline mode then cost more
instructions than our own request handling (docs/performance.md has the figures). These
statements are fixed text, so a write sends each round trip as one simple-protocol query
straight through the connection's libpq handle: the values bound in as literals by
psycopg's own adapters, the write statements prepared once per connection and run by
name (``EXECUTE``), the results loaded by psycopg's own loaders. They run inside the
transaction SQLAlchemy holds on that connection, or open it (``BEGIN`` in the same
query) when it has not sent anything yet. Everything else, and all of SQLite, goes
through SQLAlchemy.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import re
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from typing import cast

import psycopg
import psycopg.errors
from psycopg import abc
from psycopg import generators
from psycopg import pq
from psycopg.adapt import PyFormat
from psycopg.adapt import Transformer
from psycopg.types.json import Jsonb
from sqlalchemy import Connection
from sqlalchemy.dialects import postgresql
from sqlalchemy.exc import DBAPIError

from collector.models import Job
from collector.models import JSONDocument
from collector.models import UTCDateTime
from collector.store.core import table

JOBS = table(Job)
COLUMNS = [c.name for c in JOBS.c]
_MUTABLE = [name for name in COLUMNS if name != "id"]
_TIMESTAMPS = frozenset(c.name for c in JOBS.c if isinstance(c.type, UTCDateTime))
_JSON = frozenset(c.name for c in JOBS.c if c.type is JSONDocument)

_PARAMETER = re.compile(r"%\((\w+)\)s")
# Each column's type without its length, for a parameter in a SELECT list (where nothing
# else says its type); no length, so a value too long still fails as it would in VALUES.
_CAST = {c.name: re.sub(r"\(\d+\)", "", c.type.compile(dialect=postgresql.dialect()))  # type: ignore[no-untyped-call]
         for c in JOBS.c}


@dataclass(frozen=True)
class Statement:
    """A fixed statement, prepared on each connection at its first use and then run by name."""

    name: str
    text: str  # as written, with %(name)s parameters: what an error reports
    parameters: tuple[str, ...]  # the named parameters, in $1, $2, ... order
    body: bytes  # the text with $1, $2, ... in place of the names
    prepare: bytes
    execute: bytes  # b"EXECUTE name": the arguments follow in parentheses, if any


def statement(name: str, sql: str) -> Statement:
    """``sql`` (with ``%(name)s`` parameters) as a statement prepared under ``name``."""
    parameters: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match[1] not in parameters:
            parameters.append(match[1])
        return f"${parameters.index(match[1]) + 1}"

    body = _PARAMETER.sub(number, sql)
    return Statement(name, sql, tuple(parameters), body.encode(), f"PREPARE {name} AS {body}".encode(),
                     f"EXECUTE {name}".encode())


LOCK_JOB_ID = statement("collector_lock_job_id", "SELECT pg_advisory_xact_lock(%(namespace)s, hashtext(%(job_id)s))")
# The lock, then the rows, in one statement (revision 0009): the function's SELECT takes
# its snapshot once the lock is held, so it sees whatever the previous holder committed.
LOCKED_ROWS_OF_JOB_ID = statement(
    "collector_locked_rows",
    f"SELECT {', '.join(COLUMNS)} FROM collector_locked_rows(%(namespace)s, %(job_id)s)",
)

_UPDATED = "updated AS (UPDATE jobs SET {} WHERE id = %(pk)s AND %(changed)s)".format(
    ", ".join(f'"{name}" = %({name})s' for name in _MUTABLE)
)
# Counts go to one of counts.STRIPES rows per (cluster, status), picked per write, so
# concurrent writes moving jobs between the same statuses rarely hold the same row lock
# across their commits. Rows are locked in key order (ORDER BY), so no two writers wait
# on each other in a cycle. Zero deltas are filtered out.
def _counted(also: str = "") -> str:
    # ``also``: a further condition on the count's rows (that the statement inserted its job).
    return (
        "counted AS (INSERT INTO job_count_stripes (cluster, status, stripe, jobs) "
        "SELECT v.cluster, v.status, %(stripe)s::smallint, v.delta FROM "
        "(VALUES (%(old_cluster)s, %(old_status)s, %(old_delta)s::bigint), "
        "(%(new_cluster)s, %(new_status)s, %(new_delta)s::bigint)) AS v (cluster, status, delta) "
        f"WHERE v.delta <> 0{also} ORDER BY v.cluster, v.status "
        "ON CONFLICT (cluster, status, stripe) DO UPDATE SET jobs = job_count_stripes.jobs + excluded.jobs)"
    )


_COUNTED = _counted()
# No lock orders the feed and nothing notifies inside the transaction: the event's id is
# its transaction's id (the column default, store/event_ids.py) and readers stop at the
# oldest transaction still running, so writers commit in parallel and PostgreSQL flushes
# their commits together. (A NOTIFY here would take NOTIFY's own cluster-wide lock across
# the commit and serialise every writer again; each process's stream hub announces its
# writes after they commit instead, collector/fanout.py.)
EVENT_CHANNEL = "collector_events"
_EVENT = (
    "event AS (INSERT INTO job_events (job_pk, status, stage, message, created_at, credential) "
    "VALUES (%(pk)s, %(status)s, %(stage)s, %(message)s, %(created_at)s, %(credential)s) RETURNING id)"
)
# A stored job's row, with its event or without, keyed by (appends an event, moves a
# count). A write that leaves the job in its (cluster, status), a new stage or message,
# skips the count's upsert altogether (about 40 µs of server time, docs/performance.md).
SAVE_EXISTING = {
    (True, True): statement("collector_save_with_event", f"WITH {_UPDATED}, {_EVENT}, {_COUNTED} SELECT id FROM event"),
    (True, False): statement("collector_save_with_event_uncounted", f"WITH {_UPDATED}, {_EVENT} SELECT id FROM event"),
    (False, True): statement("collector_save_without_event", f"WITH {_UPDATED}, {_COUNTED} SELECT NULL"),
    (False, False): statement("collector_save_without_event_uncounted", f"WITH {_UPDATED} SELECT NULL"),
}
# A new job: its row, its first event and its count in one statement, so a POST that
# creates a job is two round trips like any other write. The event's job_pk comes from
# the row inserted in the same statement (RETURNING), and both ids come back.
# The first event of a job the same statement inserted (CTE ``inserted``).
_FIRST_EVENT = (
    "event AS (INSERT INTO job_events (job_pk, status, stage, message, created_at, credential) "
    "SELECT id, %(status)s, %(stage)s, %(message)s, %(created_at)s, %(credential)s FROM inserted "
    "RETURNING id, job_pk), "
)
_INSERTED_COLUMNS = ", ".join(f'"{name}"' for name in _MUTABLE)
SAVE_NEW_JOB = statement("collector_save_new_job", (
    f"WITH inserted AS (INSERT INTO jobs ({_INSERTED_COLUMNS}) "
    f"VALUES ({', '.join(f'%({name})s' for name in _MUTABLE)}) RETURNING id), "
    f"{_FIRST_EVENT}{_COUNTED} SELECT id, job_pk FROM event"
))


# The same, unless a row the write would land on exists (identity.find_for_write: the
# cluster's own row or the cluster-less one; without a cluster, any row of the job id):
# then it inserts nothing and returns no row. Run after LOCK_JOB_ID in the same round trip
# (insert_new_job), so its snapshot, taken when it starts, sees what the lock's previous
# holder committed.
SAVE_NEW_JOB_IF_ABSENT = statement("collector_save_new_job_if_absent", (
    f"WITH inserted AS (INSERT INTO jobs ({_INSERTED_COLUMNS}) "
    f"SELECT {', '.join(f'%({name})s::{_CAST[name]}' for name in _MUTABLE)} "
    "WHERE NOT EXISTS (SELECT FROM jobs j WHERE "
    "j.job_id = %(job_id)s AND (j.cluster = '' OR j.cluster = %(cluster)s OR %(cluster)s = '')) RETURNING id), "
    f"{_FIRST_EVENT}{_counted(' AND EXISTS (SELECT FROM inserted)')} SELECT id, job_pk FROM event"
))


# SQLSTATE classes of a session the server has ended: connection exceptions (08) and
# operator intervention short of a cancel (57P01 admin shutdown, 57P02 crash, 57P03...).
_DEAD_STATES = ("08", "57P")


def kills_connection(exc: BaseException) -> bool:
    """Whether ``exc`` leaves its psycopg connection unusable, so the transaction must move to another.

    ``closed``/``broken`` are not enough: when the server terminates a backend, libpq may
    report the FATAL message (or, in psycopg's pipeline mode, "cannot exit pipeline mode
    while busy") before it has seen the socket close, and the connection still looks healthy.
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
def _driver(conn: Connection, statements: list[Statement]) -> Iterator[psycopg.Connection[Any]]:
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
        sql = "; ".join(statement.text for statement in statements)  # only now: errors are rare
        raise DBAPIError.instance(sql, None, exc, psycopg.Error, hide_parameters=True,
                                  connection_invalidated=dead, dialect=conn.dialect) from exc


# The statements each connection has prepared. Keyed by the psycopg connection itself, so
# a replacement (after an invalidation, a recycle) starts with none; a PREPARE outlives a
# rolled back transaction, so nothing ever removes a name.
_prepared: weakref.WeakKeyDictionary[psycopg.Connection[Any], set[str]] = weakref.WeakKeyDictionary()


@dataclass
class Query:
    """A statement with its values; ``rows`` holds what it returned once it has run.

    A caller can hand a read to the round trip of the statement before it
    (``locked_job_rows``): it runs next, in the same transaction, and sees what that
    statement did (the lock it took), so the transaction saves a round trip.
    """

    statement: Statement
    params: dict[str, Any]
    rows: list[dict[str, Any]] | None = None


def execute(conn: Connection, statement: Statement, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Run ``statement`` in the transaction (opening it if need be); rows come back as dicts."""
    return _run(conn, [Query(statement, params)], commit=False)[0]


def execute_and_commit(conn: Connection, statement: Statement, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Run the transaction's last statement and its COMMIT in one round trip.

    A writer holds its job's lock and its count rows from the statement to COMMIT. Sent
    separately, the COMMIT waits for this thread to get the GIL back (up to the 5 ms
    switch interval under load) while writers of the same job or count row queue behind
    it; sent together, the server commits as soon as the statement is done. SQLAlchemy's
    own commit that follows finds the transaction closed and sends nothing.
    """
    return _run(conn, [Query(statement, params)], commit=True)[0]


def execute_all(conn: Connection, queries: list[Query], *, commit: bool) -> list[list[dict[str, Any]]]:
    """Run ``queries`` in order in one round trip (with COMMIT after them if ``commit``); their rows."""
    return _run(conn, queries, commit)


def locked_job_rows(conn: Connection, namespace: int, job_id: str,
                    prefetch: Query | None = None) -> list[dict[str, Any]]:
    """Open the transaction, take the job id's lock and read its rows, in one round trip.

    ``prefetch`` runs after them in the same round trip, under the lock.
    """
    queries = [Query(LOCKED_ROWS_OF_JOB_ID, {"namespace": namespace, "job_id": job_id})]
    if prefetch is not None:
        queries.append(prefetch)
    return job_rows(_run(conn, queries, commit=False)[0])


def _run(conn: Connection, queries: list[Query], commit: bool) -> list[list[dict[str, Any]]]:
    """Run ``queries`` in order in one round trip; fills each one's rows and returns them."""
    with _driver(conn, [query.statement for query in queries]) as driver:
        tx = Transformer.from_context(driver)
        # One simple-protocol query: [BEGIN;] then for each statement [PREPARE ...;]
        # EXECUTE name(literals), [; COMMIT]. psycopg would send a BEGIN of its own and
        # wait for it before anything else goes. Each command has one result, in order.
        parts: list[bytes] = []
        sent: list[Query | Statement | None] = []  # per command: whose rows, whose PREPARE, or neither
        preparing = False
        if driver.info.transaction_status == pq.TransactionStatus.IDLE and not driver.autocommit:
            parts.append(b"BEGIN")
            sent.append(None)
        prepared = _prepared.setdefault(driver, set())
        for query in queries:
            statement = query.statement
            if statement.name not in prepared:
                parts.append(statement.prepare)
                sent.append(statement)
                preparing = True
            if statement.parameters:
                arguments = b", ".join([literal(tx, query.params[name]) for name in statement.parameters])
                parts.append(statement.execute + b"(" + arguments + b")")
            else:
                parts.append(statement.execute)
            sent.append(query)
        if commit:
            parts.append(b"COMMIT")
            sent.append(None)
        with driver.lock:
            driver.pgconn.send_query(b"; ".join(parts))
            results = driver.wait(generators.execute(driver.pgconn))
        # After an error the server skips the rest: zip stops at the error's result.
        for what, result in zip(sent, results, strict=False) if preparing else ():
            if isinstance(what, Statement) and result.command_status == b"PREPARE":
                prepared.add(what.name)  # even when the EXECUTE after it failed
        for what, result in zip(sent, results, strict=False):
            if result.status == pq.ExecStatus.FATAL_ERROR:
                raise psycopg.errors.error_from_result(result, encoding=driver.info.encoding)
            if isinstance(what, Query):
                what.rows = _dicts(tx, result, what.statement) if result.status == pq.ExecStatus.TUPLES_OK else []
        return [query.rows or [] for query in queries]


# Each statement's column names, read from its first result: a fixed statement's columns never change.
_names: dict[str, list[str]] = {}


def _dicts(tx: abc.Transformer, rows: pq.abc.PGresult, statement: Statement) -> list[dict[str, Any]]:
    names = _names.get(statement.name)
    if names is None:
        # fname is None only past the last column.
        names = _names[statement.name] = [rows.fname(i).decode() for i in range(rows.nfields)]  # type: ignore[union-attr]
    tx.set_pgresult(rows)
    return tx.load_rows(0, rows.ntuples, lambda values: dict(zip(names, values, strict=True)))


def execute_with_bytes(conn: Connection, statement: Statement, params: dict[str, Any], *,
                       commit: bool = False) -> list[dict[str, Any]]:
    """Like ``execute`` (or ``execute_and_commit``), for a statement that carries bulk bytes.

    As a literal, 256 KiB of log bytes would travel as 512 KiB of hex for the server to
    lex and decode. Here the values go as separate parameters of the extended protocol,
    ``bytes`` in binary (as they are) and the rest as text, each statement part of one
    libpq pipeline: [BEGIN,] [Parse,] the statement [, COMMIT], one Sync, one round trip.
    """
    with _driver(conn, [statement]) as driver:
        tx = Transformer.from_context(driver)
        values = [params[name] for name in statement.parameters]
        # bytes go as they are, in binary: dumping them would copy them once more.
        binary = [type(value) is bytes for value in values]
        dumped = tx.dump_sequence([None if raw else value for value, raw in zip(values, binary, strict=True)],
                                  [PyFormat.TEXT] * len(values))
        buffers = [value if raw else text for value, text, raw in zip(values, dumped, binary, strict=True)]
        formats = [pq.Format.BINARY if raw else pq.Format.TEXT for raw in binary]
        prepared = _prepared.setdefault(driver, set())
        prepares = statement.name not in prepared
        pgconn, name = driver.pgconn, statement.name.encode()
        sent = []
        with driver.lock:
            pgconn.enter_pipeline_mode()
            try:
                if driver.info.transaction_status == pq.TransactionStatus.IDLE and not driver.autocommit:
                    pgconn.send_query_params(b"BEGIN", None)
                    sent.append("BEGIN")
                if prepares:
                    pgconn.send_prepare(name, statement.body)
                    sent.append("PREPARE")
                # libpq writes the bytes to the socket while it queues the statement (past 64 KiB
                # queued), and psycopg lets go of the GIL for that call only: in blocking mode
                # the call sends them all, instead of leaving the rest to the Sync's flush below,
                # which holds the GIL while the kernel copies them (an eighth of a log upload's
                # GIL time). libpq reads the server's answers while it waits to send, so the
                # two sides cannot block each other.
                nonblocking, pgconn.nonblocking = pgconn.nonblocking, 0
                try:
                    pgconn.send_query_prepared(name, buffers, param_formats=formats)
                finally:
                    pgconn.nonblocking = nonblocking
                sent.append("EXECUTE")
                if commit:
                    pgconn.send_query_params(b"COMMIT", None)
                    sent.append("COMMIT")
                pgconn.pipeline_sync()
                driver.wait(generators.send(pgconn))
                # One list of results per command sent, then the Sync's own.
                answers = [driver.wait(generators.fetch_many(pgconn)) for _ in sent]
                driver.wait(generators.fetch_many(pgconn))
            finally:
                if pgconn.pipeline_status != pq.PipelineStatus.OFF:
                    # Busy only when the results were not all read, i.e. the connection
                    # failed; the error raised above says so and invalidates it.
                    with contextlib.suppress(psycopg.OperationalError):
                        pgconn.exit_pipeline_mode()
        rows = None
        for what, results in zip(sent, answers, strict=True):
            for result in results:
                if result.status == pq.ExecStatus.FATAL_ERROR:
                    raise psycopg.errors.error_from_result(result, encoding=driver.info.encoding)
                if what == "PREPARE" and result.status == pq.ExecStatus.COMMAND_OK:
                    prepared.add(statement.name)
                if what == "EXECUTE" and result.status == pq.ExecStatus.TUPLES_OK:
                    rows = result
        return [] if rows is None else _dicts(tx, rows, statement)


def literal(tx: abc.Transformer, value: Any) -> bytes:
    """``value`` as an SQL literal, as psycopg's adapters would write it.

    A write binds about thirty values, most of them plain strings, integers, NULLs and
    aware timestamps, and a job's metadata and artifacts; those skip psycopg's per-value
    dumper lookup and libpq's escaping. Everything else goes to psycopg.
    """
    kind = type(value)
    if kind is str and (quoted := _quoted(value)) is not None:
        return quoted
    if value is None:
        return b"NULL"
    if kind is int:
        return b"%d" % value
    if kind is dt.datetime and value.tzinfo is not None:
        # Every timestamp the collector writes is aware (models.UTCDateTime): ISO 8601 is
        # what PostgreSQL reads, and psycopg's dumper costs more than the rest of a literal.
        stamp: dt.datetime = value
        return b"'" + stamp.isoformat().encode() + b"'::timestamptz"
    if kind is bool:
        return b"true" if value else b"false"
    if kind is Jsonb:
        # psycopg's dumper, then libpq's escaping, cost more than the rest of a PUT's
        # literals. Non-ASCII stays as it is; a document with an escaped quote or control
        # character has a backslash, and goes to psycopg.
        quoted = _quoted(json.dumps(cast(Jsonb, value).obj, ensure_ascii=False))
        if quoted is not None:
            return quoted + b"::jsonb"
    return tx.as_literal(value)


def _quoted(text: str) -> bytes | None:
    """``text`` as a string literal, or None if it holds a backslash or a NUL (for psycopg to escape).

    Doubling the quotes is all the rest needs, whatever ``standard_conforming_strings``
    says, and the connection's encoding is UTF-8 (collector/db.py).
    """
    if "\\" in text or "\0" in text:
        return None
    return b"'" + text.replace("'", "''").encode() + b"'"


def job_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows as SQLAlchemy would give them: timestamps in UTC."""
    for row in rows:
        for name in _TIMESTAMPS:
            if row[name] is not None:
                row[name] = row[name].astimezone(dt.UTC)
    return rows


def in_utc(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with every timestamp in UTC, as SQLAlchemy's UTCDateTime columns give them."""
    for name, value in row.items():
        if type(value) is dt.datetime:
            row[name] = value.astimezone(dt.UTC)
    return row


def row_params(row: dict[str, Any]) -> dict[str, Any]:
    """The job's columns as statement parameters (JSON documents wrapped for jsonb)."""
    return {name: (Jsonb(row[name]) if name in _JSON and row[name] is not None else row[name]) for name in _MUTABLE}
