"""The SQLite write path's statements, run on the transaction's sqlite3 connection itself.

A write on SQLite is five short statements (BEGIN IMMEDIATE, the job's rows, the row,
its event, its count, the last one store/counts.py's own text through ``execute``), each
of which SQLite runs in a few microseconds; through SQLAlchemy Core each one cost tens
more in execution machinery (events, the compiled cache, bind and result setup), most
of what a POST to ``collector serve`` cost (docs/performance.md). These statements are
fixed text handed to the sqlite3 connection SQLAlchemy holds for the transaction. Values
go through the very type processors SQLAlchemy's SQLite dialect uses, so timestamps,
JSON and booleans are stored exactly as its own statements store them and read back the
same way; errors are raised as SQLAlchemy's. The reads people and agents make most (a
job's detail, the event feed, the list's pages in submission order) come here the same
way (``read``, ``fetch``). Everything else goes through SQLAlchemy.
"""

from __future__ import annotations

import contextlib
import functools
import sqlite3
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from typing import cast

from sqlalchemy import Column
from sqlalchemy import ColumnElement
from sqlalchemy import Connection
from sqlalchemy import Table
from sqlalchemy.dialects import sqlite
from sqlalchemy.exc import DBAPIError

from collector.models import Job
from collector.models import JobEvent
from collector.store.core import table

Processor = Callable[[Any], Any]
# Processors depend only on the dialect's type settings, which the collector never changes.
_DIALECT = sqlite.dialect()
JOBS = table(Job)
EVENTS = table(JobEvent)
_JOB_COLUMNS = tuple(c.name for c in JOBS.c)
_EVENT_COLUMNS = ("job_pk", "status", "stage", "message", "created_at", "credential")


def _bind(column: Column[Any]) -> Processor | None:
    return column.type.dialect_impl(_DIALECT).bind_processor(_DIALECT)


def _result(column: ColumnElement[Any]) -> Processor | None:
    return column.type.dialect_impl(_DIALECT).result_processor(_DIALECT, None)


def _binds(source: Table, names: Sequence[str]) -> tuple[tuple[str, Processor | None], ...]:
    return tuple((name, _bind(source.c[name])) for name in names)


def _values(binds: tuple[tuple[str, Processor | None], ...], params: dict[str, Any]) -> list[Any]:
    return [params[name] if process is None or params[name] is None else process(params[name])
            for name, process in binds]


@dataclass(frozen=True)
class Read:
    """A fixed SELECT, and how each column it returns becomes what SQLAlchemy would give."""

    sql: str
    results: tuple[tuple[str, Processor | None], ...]


def read(sql: str, columns: Sequence[ColumnElement[Any]]) -> Read:
    """``sql``, whose result columns are ``columns`` (their names are the rows' keys)."""
    return Read(sql, tuple((column.name, _result(column)) for column in columns))


_SELECT_ROWS = read(f"SELECT {', '.join(_JOB_COLUMNS)} FROM jobs WHERE job_id = ? ORDER BY id", list(JOBS.c))
_INSERTED = tuple(name for name in _JOB_COLUMNS if name != "id")
_INSERT_JOB = f"INSERT INTO jobs ({', '.join(_INSERTED)}) VALUES ({', '.join('?' * len(_INSERTED))})"
_INSERT_JOB_BINDS = _binds(JOBS, _INSERTED)
_INSERT_EVENT = f"INSERT INTO job_events ({', '.join(_EVENT_COLUMNS)}) VALUES ({', '.join('?' * len(_EVENT_COLUMNS))})"
_INSERT_EVENT_BINDS = _binds(EVENTS, _EVENT_COLUMNS)


@contextlib.contextmanager
def _driver(conn: Connection, sql: str) -> Iterator[sqlite3.Connection]:
    """The transaction's sqlite3 connection; its errors are raised as SQLAlchemy's."""
    # The pysqlite dialect's DBAPI connection is sqlite3's own (SQLAlchemy types it as Any).
    driver = cast(sqlite3.Connection, conn.connection.driver_connection)
    try:
        yield driver
    except sqlite3.Error as exc:
        raise DBAPIError.instance(sql, None, exc, sqlite3.Error, hide_parameters=True,
                                  dialect=conn.dialect) from exc


def begin(conn: Connection, *, immediate: bool) -> None:
    """Open the transaction, taking the write lock up front when ``immediate``."""
    sql = "BEGIN IMMEDIATE" if immediate else "BEGIN"
    with _driver(conn, sql) as driver:
        driver.execute(sql)


def job_rows(conn: Connection, job_id: str) -> list[dict[str, Any]]:
    """Every row with ``job_id`` (one per cluster), oldest first, as SQLAlchemy would read them."""
    return fetch(conn, _SELECT_ROWS, (job_id,))


def fetch(conn: Connection, query: Read, params: Sequence[Any]) -> list[dict[str, Any]]:
    """The rows ``query`` returns in the transaction, as SQLAlchemy would read them."""
    with _driver(conn, query.sql) as driver:
        stored = driver.execute(query.sql, params).fetchall()
    return [
        {name: value if process is None or value is None else process(value)
         for (name, process), value in zip(query.results, values, strict=True)}
        for values in stored
    ]


def insert_job(conn: Connection, row: dict[str, Any]) -> int:
    """Insert the job ``row`` (every column but ``id``); its new id."""
    with _driver(conn, _INSERT_JOB) as driver:
        pk = driver.execute(_INSERT_JOB, _values(_INSERT_JOB_BINDS, row)).lastrowid
    assert pk is not None, "an INSERT always sets lastrowid"
    return pk


def update_job(conn: Connection, pk: int, changes: dict[str, Any]) -> None:
    """Set the ``changes`` columns of job ``pk``."""
    sql, binds = _update_statement(tuple(changes))
    with _driver(conn, sql) as driver:
        driver.execute(sql, [*_values(binds, changes), pk])


@functools.lru_cache(maxsize=256)
def _update_statement(names: tuple[str, ...]) -> tuple[str, tuple[tuple[str, Processor | None], ...]]:
    # Only the columns that changed: SQLite then leaves alone every index on the others.
    # A handful of column sets covers every lifecycle write.
    return f"UPDATE jobs SET {', '.join(f'{name} = ?' for name in names)} WHERE id = ?", _binds(JOBS, names)


def insert_event(conn: Connection, values: dict[str, Any]) -> int:
    """Append an event (``values`` keyed by job_events column); its id."""
    with _driver(conn, _INSERT_EVENT) as driver:
        event_id = driver.execute(_INSERT_EVENT, _values(_INSERT_EVENT_BINDS, values)).lastrowid
    assert event_id is not None, "an INSERT always sets lastrowid"
    return event_id


def execute(conn: Connection, sql: str, params: dict[str, Any]) -> None:
    """Run ``sql`` (``:name`` parameters, values needing no type processing) in the transaction."""
    with _driver(conn, sql) as driver:
        driver.execute(sql, params)
