"""Engine and transactions: one engine per app, one short transaction per unit of work."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any
from typing import TypeVar

from flask import Flask
from flask import current_app
from sqlalchemy import Connection
from sqlalchemy import Engine
from sqlalchemy import create_engine
from sqlalchemy import event
from sqlalchemy import make_url
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import ConnectionPoolEntry

from collector.settings import Settings
from collector.store import pg_driver
from collector.store import sqlite_driver

# Execution option that makes a SQLite transaction take the write lock up front.
WRITE_OPTION = "collector_write"
T = TypeVar("T")


def sqlite_file(url: str) -> str | None:
    """The file of a SQLite URL; None for another database or an in-memory one."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database and parsed.database != ":memory:":
        return parsed.database
    return None


def ensure_sqlite_parent(url: str) -> None:
    """Create the directory of a SQLite file URL (the default lives under ~/.local/state)."""
    path = sqlite_file(url)
    if path is not None:
        Path(path).expanduser().parent.mkdir(parents=True, exist_ok=True)


def make_engine(settings: Settings) -> Engine:
    """Create the engine for the configured database, tuned per backend."""
    url = settings.database_url
    if url.startswith("sqlite"):
        ensure_sqlite_parent(url)
        # A file's pool keeps a connection per request thread, as on PostgreSQL: a new
        # SQLite connection sets its pragmas and reads the schema again. (An in-memory
        # database lives in one connection per thread, SQLAlchemy's SingletonThreadPool.)
        pool = ({"pool_size": settings.pool_kept, "max_overflow": settings.pool_max_overflow}
                if sqlite_file(url) else {})
        engine = create_engine(url, connect_args={"timeout": 30}, **pool)
        _tune_sqlite(engine)
        return engine
    engine = create_engine(
        url,
        pool_size=settings.pool_kept,
        max_overflow=settings.pool_max_overflow,
        # No pre-ping (a round trip on every checkout, i.e. every request): a connection
        # that died with a database restart fails its first statement instead, and
        # ``Database.run`` replays the whole transaction once on a fresh connection.
        pool_recycle=3600,
        # Fail a readiness probe in seconds, not after the kernel's TCP timeout. No
        # automatic preparation by psycopg: once it has prepared anything, every rollback
        # sends DEALLOCATE ALL, which would also drop the write path's own prepared
        # statements (store/pg_driver.py) behind its back. UTF-8 whatever the database's
        # encoding: the write path quotes plain strings itself (pg_driver.literal).
        connect_args={"connect_timeout": 5, "prepare_threshold": None, "client_encoding": "utf8"},
    )
    event.listen(engine, "handle_error", _mark_dead_connections)
    event.listen(engine, "connect", _widen_backend_heap)
    return engine


# Larger than any upload's peak in a backend: a 1 MiB chunk (the reporter's largest, and
# the body limit) is a 2 MiB message buffer, its 1 MiB parameter and its compressed copy.
BACKEND_HEAP_PRIMER = 4 * 1024 * 1024


def _widen_backend_heap(dbapi_connection: Any, _record: ConnectionPoolEntry) -> None:
    """Have a new backend allocate and free one large block, so its heap stops shrinking after each upload.

    PostgreSQL allocates through glibc's malloc, which trims the top of the heap back to
    the kernel once more than twice its mmap threshold lies free there. The threshold
    starts at 128 KiB and rises only to the size of an mmapped block when one is freed
    (mallopt(3)). A 256 KiB log chunk takes about 1 MiB at its peak, so without this a
    backend gave that memory back after every upload and faulted it in again for the next:
    about 100 page faults and a quarter of an upload's server CPU (docs/performance.md).
    Freeing one 4 MiB block lifts the threshold past every upload's peak, once per
    session; other allocators ignore it.
    """
    dbapi_connection.pgconn.exec_(b"SELECT length(repeat(' ', %d))" % BACKEND_HEAP_PRIMER)


def _mark_dead_connections(context: ExceptionContext) -> None:
    # SQLAlchemy's psycopg dialect calls a connection dead only once psycopg says it is
    # closed or broken, which a terminated backend often is not yet: the error is then
    # raised as a plain one, the connection goes back to the pool and no replay happens.
    if not context.is_disconnect and pg_driver.kills_connection(context.original_exception):
        context.is_disconnect = True


def _tune_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def on_connect(dbapi_connection: sqlite3.Connection, _record: ConnectionPoolEntry) -> None:
        # Let SQLAlchemy, not the driver, decide when a transaction begins.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    @event.listens_for(engine, "begin")
    def on_begin(connection: Connection) -> None:
        # A deferred transaction that later writes can fail with SQLITE_BUSY without
        # waiting; writers take the lock at BEGIN so they queue on busy_timeout instead.
        sqlite_driver.begin(connection, immediate=bool(connection.get_execution_options().get(WRITE_OPTION)))


class Database:
    """The engine and session factory an app uses."""

    def __init__(self, settings: Settings) -> None:
        self.engine = make_engine(settings)
        self.is_sqlite = settings.is_sqlite
        # SQLite writers' connections take the write lock at BEGIN (_tune_sqlite). The
        # option is set once on an engine that shares the pool, not copied onto each
        # request's connection.
        self._writer_engine = self.engine.execution_options(**{WRITE_OPTION: True}) if self.is_sqlite else self.engine
        self._sqlite_writer = threading.Lock()

    def _writer_turn(self, write: bool) -> contextlib.AbstractContextManager[object]:
        # SQLite admits one writer; a second one waits in SQLite's busy handler, which
        # sleeps in growing steps (up to 100 ms) and makes tail latency. Writers of this
        # process queue on a lock instead; other processes still meet busy_timeout.
        return self._sqlite_writer if write and self.is_sqlite else contextlib.nullcontext()

    def run(self, work: Callable[[Connection], T], *, write: bool = False) -> T:
        """Run ``work`` in one transaction and commit it; replay once if the connection had died.

        "Died" covers every statement of the transaction, the ones store/pg_driver.py
        sends through libpq and the COMMIT included. A connection that died at COMMIT may
        have committed; replaying is still safe because every write is idempotent (the
        same request again changes nothing the first one did not; tests/test_db.py).
        Core connections, not ORM sessions: store functions work on rows, and a session
        per request was a measurable share of the write path (see docs/performance.md).
        """
        for attempt in (1, 2):
            try:
                engine = self._writer_engine if write else self.engine
                with self._writer_turn(write), engine.connect() as conn, conn.begin():
                    return work(conn)
            except DBAPIError as exc:
                if attempt == 2 or not exc.connection_invalidated:
                    raise
                # One dead connection usually means all of them (a restart, a failover, an
                # idle timeout): replay on a fresh pool, not on the next dead connection.
                self.engine.dispose()
        raise AssertionError("unreachable")

    def dispose(self) -> None:
        """Close every pooled connection (after fork, at shutdown)."""
        self.engine.dispose()


def init_app(app: Flask, database: Database) -> None:
    """Attach ``database`` to ``app``."""
    app.extensions["collector.db"] = database


def get_db() -> Database:
    """The current app's database."""
    database: Database = current_app.extensions["collector.db"]
    return database


def transaction(work: Callable[[Connection], T], *, write: bool = False) -> T:
    """Run ``work(conn)`` in one committed transaction of the current app's database."""
    return get_db().run(work, write=write)


def get_db_of(app: Flask) -> Database:
    """The database of ``app`` outside a request."""
    database: Database = app.extensions["collector.db"]
    return database
