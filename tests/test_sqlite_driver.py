"""The SQLite write path's statements store and read exactly what SQLAlchemy's would.

``store/sqlite_driver.py`` hands fixed SQL to the sqlite3 connection with values run
through the dialect's own type processors. These tests write the same row both ways and
compare the stored bytes, so a timestamp or JSON format that drifted from SQLAlchemy's
(which every read path parses) fails here rather than in a list page.
"""

from __future__ import annotations

import datetime as dt
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection
from sqlalchemy import insert
from sqlalchemy import select
from sqlalchemy import update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.exc import OperationalError

from collector.db import Database
from collector.migrations import upgrade
from collector.settings import Settings
from collector.store import counts
from collector.store import sqlite_driver
from collector.store.events import EVENTS
from collector.store.identity import JOBS

CET = dt.timezone(dt.timedelta(hours=1))
ROW: dict[str, Any] = {
    "cluster": "b200",
    "job_name": "naïve 'quoted' café",
    "is_placeholder": True,
    "status": "running",
    "stage": "benchmark",
    "message": None,
    "recipe": "r.yaml",
    # Another offset and microseconds: the stored text must be SQLAlchemy's naive UTC.
    "submitted_at": dt.datetime(2025, 1, 26, 11, 40, 0, 123456, tzinfo=CET),
    "started_at": dt.datetime(2025, 1, 26, 10, 41, tzinfo=dt.UTC),
    "completed_at": None,
    "updated_at": dt.datetime(2025, 1, 26, 10, 42, 7, 5, tzinfo=dt.UTC),
    "exit_code": 0,
    "logs_url": None,
    "benchmark_results": {"tokens/s": 1234.5, "nested": {"ok": True, "list": [1, None, "ü"]}},
    "artifacts": None,
    "metadata": {"cluster": "b200", "model": {"path": "/models/ä"}},
    "received_at": dt.datetime(2025, 1, 26, 10, 42, 8, tzinfo=dt.UTC),
}


@pytest.fixture
def database(tmp_path: Path) -> Iterator[Database]:
    url = f"sqlite:///{tmp_path / 'driver.db'}"
    upgrade(url)
    database = Database(Settings(database_url=url))
    yield database
    database.dispose()


def _stored(database: Database, table: str, key: str, value: Any) -> tuple[Any, ...]:
    """A row's stored values as sqlite3 itself reads them, without any type processing."""
    path = database.engine.url.database
    assert path is not None
    with sqlite3.connect(path) as raw:
        found = raw.execute(f"SELECT * FROM {table} WHERE {key} = ?", (value,)).fetchone()
    assert found is not None
    return tuple(found)


def _without_identity(stored: tuple[Any, ...]) -> tuple[Any, ...]:
    # jobs: (id, cluster, job_id, ...): everything but the two that differ on purpose.
    return stored[1:2] + stored[3:]


def test_a_job_row_is_stored_and_read_back_as_sqlalchemy_would(database: Database) -> None:
    def write(conn: Connection) -> None:
        mine = sqlite_driver.insert_job(conn, {**ROW, "job_id": "mine"})
        theirs = conn.execute(insert(JOBS).returning(JOBS.c.id), {**ROW, "job_id": "theirs"}).scalar_one()
        assert mine == theirs - 1
        changes = {"status": "completed", "completed_at": dt.datetime(2025, 1, 26, 12, tzinfo=CET),
                   "artifacts": {"a": ["b"]}, "is_placeholder": False, "message": "done"}
        sqlite_driver.update_job(conn, mine, changes)
        conn.execute(update(JOBS).where(JOBS.c.id == theirs), changes)

    database.run(write, write=True)
    mine = _stored(database, "jobs", "job_id", "mine")
    theirs = _stored(database, "jobs", "job_id", "theirs")
    assert _without_identity(mine) == _without_identity(theirs)
    # The format every reader parses: naive UTC text with microseconds.
    assert mine[list(sqlite_driver._JOB_COLUMNS).index("submitted_at")] == "2025-01-26 10:40:00.123456"

    def read(conn: Connection) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        return (sqlite_driver.job_rows(conn, "mine"),
                dict(conn.execute(select(JOBS).where(JOBS.c.job_id == "mine")).mappings().one()))

    rows, expected = database.run(read)
    assert rows == [expected]
    assert rows[0]["submitted_at"] == ROW["submitted_at"] and rows[0]["submitted_at"].tzinfo == dt.UTC
    assert rows[0]["is_placeholder"] is False
    assert rows[0]["benchmark_results"] == ROW["benchmark_results"]


def test_rows_of_one_job_id_come_oldest_first_and_an_unknown_id_has_none(database: Database) -> None:
    def write(conn: Connection) -> list[int]:
        return [sqlite_driver.insert_job(conn, {**ROW, "cluster": cluster, "job_id": "twice"})
                for cluster in ("z-last-name", "a-first-name")]

    pks = database.run(write, write=True)
    rows = database.run(lambda conn: sqlite_driver.job_rows(conn, "twice"))
    assert [(row["id"], row["cluster"]) for row in rows] == [(pks[0], "z-last-name"), (pks[1], "a-first-name")]
    assert database.run(lambda conn: sqlite_driver.job_rows(conn, "nobody")) == []


def test_an_event_is_stored_as_sqlalchemy_would(database: Database) -> None:
    values = {"status": "failed", "stage": None, "message": "exit 1 — OOM",
              "created_at": dt.datetime(2025, 1, 26, 11, 0, 0, 1, tzinfo=CET), "credential": "env:write"}

    def write(conn: Connection) -> tuple[int, int]:
        pk = sqlite_driver.insert_job(conn, {**ROW, "job_id": "evented"})
        mine = sqlite_driver.insert_event(conn, {**values, "job_pk": pk})
        theirs = conn.execute(insert(EVENTS).returning(EVENTS.c.id), {**values, "job_pk": pk}).scalar_one()
        return mine, theirs

    mine, theirs = database.run(write, write=True)
    assert theirs == mine + 1
    assert _stored(database, "job_events", "id", mine)[1:] == _stored(database, "job_events", "id", theirs)[1:]


def test_counts_move_through_the_driver(database: Database) -> None:
    def move(conn: Connection) -> None:
        counts.move(conn, None, ("b200", "running"))
        counts.move(conn, None, ("b200", "running"))
        counts.move(conn, ("b200", "running"), ("b200", "failed"))

    database.run(move, write=True)
    path = database.engine.url.database
    assert path is not None
    with sqlite3.connect(path) as raw:
        stored = raw.execute("SELECT cluster, status, jobs FROM job_counts ORDER BY status").fetchall()
    assert stored == [("b200", "failed", 1), ("b200", "running", 1)]


def test_errors_are_raised_as_sqlalchemys_with_the_statement(database: Database) -> None:
    def duplicate(conn: Connection) -> None:
        sqlite_driver.insert_job(conn, {**ROW, "job_id": "dup"})
        sqlite_driver.insert_job(conn, {**ROW, "job_id": "dup"})

    with pytest.raises(IntegrityError) as raised:
        database.run(duplicate, write=True)
    assert "UNIQUE constraint failed: jobs.cluster, jobs.job_id" in str(raised.value)
    assert "INSERT INTO jobs (cluster, job_id" in str(raised.value)
    # The transaction was rolled back: not even the first row is there.
    assert database.run(lambda conn: sqlite_driver.job_rows(conn, "dup")) == []


def test_a_write_holds_the_write_lock_from_its_first_statement(database: Database) -> None:
    path = database.engine.url.database
    assert path is not None

    def meanwhile(conn: Connection) -> str:
        # Nothing written yet in this transaction: only BEGIN IMMEDIATE can have locked.
        with sqlite3.connect(path, timeout=0, isolation_level=None) as other:
            try:
                other.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                return str(exc)
            other.execute("ROLLBACK")
            return "not locked"

    assert database.run(meanwhile, write=True) == "database is locked"
    assert database.run(meanwhile) == "not locked"


def test_a_busy_database_fails_as_sqlalchemys_operational_error(database: Database) -> None:
    path = database.engine.url.database
    assert path is not None
    database.run(lambda conn: None)  # the file in WAL mode first, as a running collector has it
    with sqlite3.connect(path, isolation_level=None) as other:
        other.execute("BEGIN IMMEDIATE")
        try:
            with database.engine.connect() as conn:
                # Fail at once instead of waiting out the server's busy_timeout.
                driver = conn.connection.driver_connection
                assert isinstance(driver, sqlite3.Connection)
                driver.execute("PRAGMA busy_timeout=0")
                with pytest.raises(OperationalError, match=r"database is locked[\s\S]*BEGIN IMMEDIATE"):
                    sqlite_driver.begin(conn, immediate=True)
        finally:
            other.execute("ROLLBACK")
