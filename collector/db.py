"""Engine and sessions: one engine per app, one session per app context."""

from __future__ import annotations

from pathlib import Path

from flask import Flask
from flask import current_app
from flask import g
from sqlalchemy import Engine
from sqlalchemy import create_engine
from sqlalchemy import event
from sqlalchemy import make_url
from sqlalchemy.orm import Session
from sqlalchemy.orm import sessionmaker

from collector.settings import Settings

# Execution option that makes a SQLite transaction take the write lock up front.
WRITE_OPTION = "collector_write"


def ensure_sqlite_parent(url: str) -> None:
    """Create the directory of a SQLite file URL (the default lives under ~/.local/state)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database and parsed.database != ":memory:":
        Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)


def make_engine(settings: Settings) -> Engine:
    """Create the engine for the configured database, tuned per backend."""
    url = settings.database_url
    if url.startswith("sqlite"):
        ensure_sqlite_parent(url)
        engine = create_engine(url, connect_args={"timeout": 30})
        _tune_sqlite(engine)
        return engine
    return create_engine(
        url,
        pool_size=settings.pool_size,
        max_overflow=settings.pool_max_overflow,
        pool_pre_ping=True,
        # Fail a readiness probe in seconds, not after the kernel's TCP timeout.
        connect_args={"connect_timeout": 5},
    )


def _tune_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def on_connect(dbapi_connection, _record):
        # Let SQLAlchemy, not the driver, decide when a transaction begins.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    @event.listens_for(engine, "begin")
    def on_begin(connection):
        # A deferred transaction that later writes can fail with SQLITE_BUSY without
        # waiting; writers take the lock at BEGIN so they queue on busy_timeout instead.
        immediate = connection.get_execution_options().get(WRITE_OPTION)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


class Database:
    """The engine and session factory an app uses."""

    def __init__(self, settings: Settings) -> None:
        self.engine = make_engine(settings)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)

    def session(self, *, write: bool = False) -> Session:
        """Open a session; ``write`` makes its transaction a writer from the start."""
        session = self.sessions()
        if write:
            session.connection(execution_options={WRITE_OPTION: True})
        return session

    def dispose(self) -> None:
        """Close every pooled connection (after fork, at shutdown)."""
        self.engine.dispose()


def init_app(app: Flask, database: Database) -> None:
    """Attach ``database`` to ``app`` and close the request session at teardown."""
    app.extensions["collector.db"] = database
    app.teardown_appcontext(_close_session)


def get_db() -> Database:
    """The current app's database."""
    return current_app.extensions["collector.db"]


def get_session(*, write: bool = False) -> Session:
    """The session of the current app context, opened on first use."""
    session = g.get("db_session")
    if session is None:
        session = g.db_session = get_db().session(write=write)
    return session


def _close_session(_exc: BaseException | None) -> None:
    session = g.pop("db_session", None)
    if session is not None:
        session.close()


def get_db_of(app: Flask) -> Database:
    """The database of ``app`` outside a request."""
    return app.extensions["collector.db"]
