"""The PostgreSQL write path runs through libpq inside SQLAlchemy's transaction.

``pg_driver.execute_and_commit`` sends the last statement and COMMIT in one query on
the DBAPI connection SQLAlchemy holds; SQLAlchemy's own commit afterwards must find the
transaction closed and send nothing, and the connection must go back to the pool idle.
Its statements are prepared once per connection, whatever happened to the first use.
This relies on how SQLAlchemy and psycopg behave, not on anything they document: these
tests fail if a release of either changes it.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import random
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import pq
from psycopg.adapt import Transformer
from psycopg.pq import TransactionStatus
from psycopg.types.json import Jsonb
from sqlalchemy import Connection
from sqlalchemy import create_engine
from sqlalchemy import event
from sqlalchemy import make_url
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from collector.contract import JobCreatePayload
from collector.contract import JobStage
from collector.contract import JobStatus
from collector.contract import JobUpdatePayload
from collector.db import Database
from collector.migrations import upgrade
from collector.settings import Settings
from collector.store import captures as capture_store
from collector.store import counts
from collector.store import jobs as job_store
from collector.store import logs as log_store
from collector.store import pg_driver
from collector.store import writes
from collector.store.errors import Conflict
from collector.store.identity import JOB_LOCK


class Watched:
    """A one-connection Database whose psycopg connection is watched from the inside and from the server."""

    def __init__(self, url: str) -> None:
        self.database = Database(Settings(database_url=url, pool_size=1, pool_max_overflow=0))
        self.notices: list[str] = []
        self.pids: set[int] = set()
        self.status_in_work: list[TransactionStatus] = []
        self.status_at_checkin: list[TransactionStatus] = []
        # "reset" fires as the connection goes back to the pool, before any reset of its own.
        event.listen(self.database.engine, "reset", self._on_return)

    def _on_return(self, dbapi_connection: Any, _record: Any, _state: Any) -> None:
        self.status_at_checkin.append(dbapi_connection.info.transaction_status)

    def _on_notice(self, diagnostic: psycopg.errors.Diagnostic) -> None:
        self.notices.append(f"{diagnostic.severity}: {diagnostic.message_primary}")

    def watch(self, conn: Connection) -> psycopg.Connection[Any]:
        """Called first thing in a unit of work: hook the notices of the connection it runs on."""
        driver: psycopg.Connection[Any] = conn.connection.driver_connection  # type: ignore[assignment]
        if driver.info.backend_pid not in self.pids:
            driver.add_notice_handler(self._on_notice)
            self.pids.add(driver.info.backend_pid)
        return driver

    def close(self) -> None:
        self.database.dispose()


@pytest.fixture
def watched(postgres):
    postgres.clean()
    watched = Watched(postgres.url)
    yield watched
    watched.close()
    postgres.clean()


def backend(postgres, pid: int) -> tuple[str, str, Any]:
    """What the server says of backend ``pid``, asked on another connection: state, last query, open xid."""
    with postgres.engine.connect() as conn:
        row = conn.execute(text("SELECT state, query, backend_xid FROM pg_stat_activity WHERE pid = :pid"),
                           {"pid": pid}).one()
    return row.state, row.query, row.backend_xid


def assert_closed_cleanly(watched: Watched, postgres) -> None:
    # The work ran inside a transaction SQLAlchemy had begun on the psycopg connection...
    assert watched.status_in_work and all(s == TransactionStatus.INTRANS for s in watched.status_in_work)
    # ...which psycopg's COMMIT ended: SQLAlchemy's COMMIT (or a pool ROLLBACK) sent
    # after it would have drawn "WARNING: there is no transaction in progress".
    assert watched.notices == []
    assert watched.status_at_checkin == [TransactionStatus.IDLE]
    (pid,) = watched.pids
    state, query, xid = backend(postgres, pid)
    # The last query the server ran on it was the write path's own (its text may be cut
    # short there): anything SQLAlchemy or the pool sent after it would be a bare statement.
    assert (state, query.split(" ", 1)[0], xid) in {("idle", word, None) for word in ("BEGIN;", "PREPARE", "EXECUTE")}


def test_a_work_ending_in_execute_and_commit_commits_once_and_returns_the_connection_idle(watched, postgres):
    cluster = f"pg-driver-{uuid.uuid4().hex[:8]}"

    def work(conn: Connection) -> list[dict[str, Any]]:
        driver = watched.watch(conn)
        # A statement through SQLAlchemy opens its transaction; the driver's statement joins it.
        conn.execute(text("INSERT INTO job_counts (cluster, status, jobs) VALUES (:c, 'submitted', 1)"), {"c": cluster})
        watched.status_in_work.append(driver.info.transaction_status)
        return pg_driver.execute_and_commit(conn, pg_driver.statement(
            "collector_test_insert",
            "INSERT INTO job_counts (cluster, status, jobs) VALUES (%(c)s, 'running', %(jobs)s::int) RETURNING jobs",
        ), {"c": cluster, "jobs": 2})

    assert watched.database.run(work, write=True) == [{"jobs": 2}]

    assert_closed_cleanly(watched, postgres)
    with postgres.engine.connect() as other:
        stored = other.execute(text("SELECT status, jobs FROM job_counts WHERE cluster = :c ORDER BY status"),
                               {"c": cluster}).all()
    assert [tuple(row) for row in stored] == [("running", 2), ("submitted", 1)]


def test_the_write_path_commits_through_the_driver_and_leaves_the_connection_idle(watched, postgres):
    job_id = f"pg-driver-{uuid.uuid4().hex[:8]}"
    payload = JobCreatePayload(job_id=job_id, job_name="probe", submitted_at=dt.datetime.now(dt.UTC),
                               cluster="pg-driver")

    def work(conn: Connection) -> job_store.WriteResult:
        driver = watched.watch(conn)
        # Begin SQLAlchemy's transaction as the store's first statement would.
        conn.execute(text("SELECT 1"))
        watched.status_in_work.append(driver.info.transaction_status)
        return job_store.submit(conn, payload)

    watched.database.run(work, write=True)

    assert_closed_cleanly(watched, postgres)
    assert postgres.scalar("SELECT count(*) FROM jobs WHERE job_id = :j", j=job_id) == 1
    assert postgres.scalar("SELECT count(*) FROM job_events e JOIN jobs j ON j.id = e.job_pk WHERE j.job_id = :j",
                           j=job_id) == 1
    postgres.assert_counts_match_jobs()


def test_the_watch_sees_a_commit_sent_after_the_transaction_ended(watched, postgres):
    """The checks above can fail: a second COMMIT after the driver's draws the warning they look for."""

    def work(conn: Connection) -> None:
        driver = watched.watch(conn)
        pg_driver.execute_and_commit(conn, pg_driver.statement("collector_test_select", "SELECT 1"), {})
        # Straight to libpq: psycopg's own execute would first open a new transaction.
        driver.pgconn.exec_(b"COMMIT")

    watched.database.run(work)

    assert watched.notices == ["WARNING: there is no transaction in progress"]


def client_waits(trace: str) -> list[list[str]]:
    """What a traced client sent before each wait for the server: one list per round trip.

    In libpq's trace (F: frontend, B: backend) a round trip is a run of frontend
    messages followed by the server's answers. A simple-protocol query appears as the
    first word of each of its statements (BEGIN, PREPARE, EXECUTE, COMMIT).
    """
    waits: list[list[str]] = []
    sent: list[str] = []
    for line in trace.splitlines():
        if line.count("\t") < 2:
            continue  # the rest of a statement SQLAlchemy wrote over several lines
        direction, _, message, *payload = line.split("\t")
        if direction == "F":
            kind = message.split(" ")[0]
            if kind == "Query":
                text_sent = payload[0].strip().strip('"')
                sent.extend(statement.split()[0] for statement in text_sent.split("; "))
            else:
                sent.append(kind)
        elif sent:
            waits.append(sent)
            sent = []
    return waits


# The general write path: BEGIN, the lock and the read; then the write and COMMIT; each
# statement prepared on the connection's first use of it. (psycopg alone would wait for
# its BEGIN, and sync once more after a pipelined commit(): four. A new job's row went
# through SQLAlchemy between the two: three.)
TWO_ROUND_TRIPS = [["BEGIN", "PREPARE", "EXECUTE"], ["PREPARE", "EXECUTE", "COMMIT"]]


def traced_waits(watched: Watched, trace_path, write) -> tuple[Any, list[list[str]]]:
    """Run ``write(conn)`` as a unit of work under libpq's trace: its result and its round trips."""

    def work(conn: Connection) -> Any:
        driver = watched.watch(conn)
        # The unit of work starts with no statement sent: the store opens the transaction.
        watched.status_in_work.append(driver.info.transaction_status)
        with open(trace_path, "w") as trace:
            driver.pgconn.trace(trace.fileno())
            driver.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
            try:
                return write(conn)
            finally:
                driver.pgconn.untrace()

    result = watched.database.run(work, write=True)
    return result, client_waits(trace_path.read_text())


def test_a_put_on_its_stored_job_is_one_round_trip(watched, postgres, tmp_path):
    job_id = f"pg-driver-{uuid.uuid4().hex[:8]}"
    submitted = JobCreatePayload(job_id=job_id, job_name="probe", submitted_at=dt.datetime.now(dt.UTC),
                                 cluster="pg-driver")
    watched.database.run(lambda conn: job_store.submit(conn, submitted), write=True)
    put = JobUpdatePayload(status=JobStatus.WORKERS, stage=JobStage.WORKERS, message="up",
                           updated_at=dt.datetime.now(dt.UTC), metadata={"cluster": "pg-driver"})

    result, waits = traced_waits(watched, tmp_path / "libpq.trace",
                                 lambda conn: job_store.update(conn, job_id, put, cluster="pg-driver"))

    assert (result.status, result.event is not None) == ("workers", True)
    assert watched.status_in_work == [TransactionStatus.IDLE]
    # BEGIN, collector_put_job() (prepared at its first use on the connection), COMMIT.
    assert waits == [["BEGIN", "PREPARE", "EXECUTE", "COMMIT"]], waits
    put = put.model_copy(update={"status": JobStatus.BENCHMARK, "stage": JobStage.BENCHMARK})
    result, waits = traced_waits(watched, tmp_path / "libpq.trace",
                                 lambda conn: job_store.update(conn, job_id, put, cluster="pg-driver"))
    assert result.status == "benchmark"
    assert waits == [["BEGIN", "EXECUTE", "COMMIT"]], waits
    # A late PUT: the statement declines and commits nothing, the general path applies it.
    late = put.model_copy(update={"status": JobStatus.WORKERS, "updated_at": submitted.submitted_at})
    result, waits = traced_waits(watched, tmp_path / "libpq.trace",
                                 lambda conn: job_store.update(conn, job_id, late, cluster="pg-driver"))
    assert (result.status, result.late) == ("benchmark", True)
    assert waits == [["BEGIN", "EXECUTE", "COMMIT"], *TWO_ROUND_TRIPS], waits
    # Every unit of work (the POST's too) went back to the pool idle, with no stray COMMIT.
    assert watched.notices == [] and watched.status_at_checkin == [TransactionStatus.IDLE] * 4
    assert postgres.scalar("SELECT status FROM jobs WHERE job_id = :j", j=job_id) == "benchmark"


@pytest.mark.parametrize("first_write", ["post", "put"])
def test_a_new_job_gets_its_row_event_and_count_in_one_statement(watched, postgres, tmp_path, first_write):
    """A new job's first write is one round trip, whether a POST or a PUT (its placeholder).

    A POST sends the lock, then the insert unless a row exists; a PUT, collector_put_job()
    (revision 0017), which inserts the placeholder the general path would.
    """
    job_id = f"pg-driver-{uuid.uuid4().hex[:8]}"
    cluster = f"pg-new-{first_write}-{uuid.uuid4().hex[:6]}"
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    if first_write == "post":
        payload: Any = JobCreatePayload(job_id=job_id, job_name="probe", submitted_at=now, cluster=cluster)
        result, waits = traced_waits(watched, tmp_path / "libpq.trace",
                                     lambda conn: job_store.submit(conn, payload, credential="tok-a"))
        expected: tuple[str, str | None, str | None, bool] = ("submitted", None, None, False)
        round_trips = [["BEGIN", "PREPARE", "EXECUTE", "PREPARE", "EXECUTE", "COMMIT"]]
    else:
        payload = JobUpdatePayload(status=JobStatus.WORKERS, stage=JobStage.WORKERS, message="up",
                                   updated_at=now, metadata={"cluster": cluster})
        result, waits = traced_waits(watched, tmp_path / "libpq.trace",
                                     lambda conn: job_store.update(conn, job_id, payload, credential="tok-a"))
        expected = ("workers", "workers", "up", True)
        round_trips = [["BEGIN", "PREPARE", "EXECUTE", "COMMIT"]]

    assert waits == round_trips, waits
    assert watched.notices == [] and watched.status_at_checkin == [TransactionStatus.IDLE]
    job = postgres.row("SELECT id, status, stage, message, is_placeholder FROM jobs WHERE job_id = :j", j=job_id)
    assert job[1:] == expected
    # The event belongs to the row inserted in the same statement, and the record says so.
    event = postgres.row("SELECT id, job_pk, status, created_at, credential FROM job_events WHERE job_pk = :pk",
                         pk=job[0])
    assert event[1:] == (job[0], expected[0], now, "tok-a")
    assert (result.event.id, result.event.status, result.cluster) == (event[0], expected[0], cluster)
    assert postgres.count_of(cluster, expected[0]) == 1


def test_a_failed_first_use_leaves_the_statement_prepared_and_the_connection_opening_its_own_transactions(
        watched, postgres, tmp_path):
    # The first use sends BEGIN; PREPARE; EXECUTE. When the EXECUTE fails and the connection
    # lives on (here a statement timeout while another session holds the job's lock), the
    # PREPARE stands (it is not transactional): preparing again would fail ("already
    # exists"), and a half-opened transaction must not leak into the next unit of work.
    job_id = f"pg-driver-{uuid.uuid4().hex[:8]}"
    watched.database.run(lambda conn: conn.execute(text("SET statement_timeout = '200ms'")))
    holder = psycopg.connect(postgres.url.replace("postgresql+psycopg://", "postgresql://"))
    try:
        holder.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (JOB_LOCK, job_id))

        def read(conn: Connection) -> list[dict[str, Any]]:
            watched.watch(conn)
            return pg_driver.locked_job_rows(conn, JOB_LOCK, job_id)

        with pytest.raises(DBAPIError) as failed:
            watched.database.run(read)
        assert isinstance(failed.value.orig, psycopg.errors.QueryCanceled)
        assert not failed.value.connection_invalidated
    finally:
        holder.close()

    rows, waits = traced_waits(watched, tmp_path / "libpq.trace",
                               lambda conn: pg_driver.locked_job_rows(conn, JOB_LOCK, job_id))
    assert (rows, waits) == ([], [["BEGIN", "EXECUTE"]])

    def half_done(conn: Connection) -> None:
        driver = watched.watch(conn)
        assert driver.autocommit is False
        conn.execute(text("INSERT INTO job_counts (cluster, status, jobs) VALUES (:c, 'submitted', 1)"), {"c": job_id})
        raise RuntimeError("the unit of work fails after its insert")

    with pytest.raises(RuntimeError):
        watched.database.run(half_done)
    # Same connection (pool of one), and the insert was rolled back with its transaction.
    assert len(watched.pids) == 1
    assert postgres.scalar("SELECT count(*) FROM job_counts WHERE cluster = :c", c=job_id) == 0


def test_a_replacement_connection_prepares_the_statements_again(watched, postgres, tmp_path):
    # A terminated backend takes its prepared statements with it: the unit of work replays
    # on a new connection (db.Database.run), which must prepare before it executes.
    job_id = f"pg-driver-{uuid.uuid4().hex[:8]}"
    _, waits = traced_waits(watched, tmp_path / "libpq.trace",
                            lambda conn: pg_driver.locked_job_rows(conn, JOB_LOCK, job_id))
    assert waits == [["BEGIN", "PREPARE", "EXECUTE"]]
    (first,) = watched.pids
    assert postgres.scalar("SELECT pg_terminate_backend(:pid)", pid=first) is True

    rows, waits = traced_waits(watched, tmp_path / "libpq.trace",
                               lambda conn: pg_driver.locked_job_rows(conn, JOB_LOCK, job_id))

    assert rows == [] and len(watched.pids) == 2
    assert waits == [["BEGIN", "PREPARE", "EXECUTE"]], waits


def test_the_statements_survive_rollbacks_after_many_reads(watched, postgres):
    # psycopg prepares a query by itself after a few runs, and from then on sends
    # DEALLOCATE ALL with every rollback: our statements would go too, and the next write
    # on the connection would fail ("prepared statement ... does not exist").
    job_id = f"pg-driver-{uuid.uuid4().hex[:8]}"
    read = text("SELECT count(*) FROM jobs WHERE job_id = :j")
    watched.database.run(lambda conn: pg_driver.locked_job_rows(conn, JOB_LOCK, job_id))
    for _ in range(10):
        watched.database.run(lambda conn: conn.execute(read, {"j": job_id}).scalar_one())

    def rolled_back(conn: Connection) -> None:
        conn.execute(read, {"j": job_id})
        raise RuntimeError("the unit of work fails")

    with pytest.raises(RuntimeError):
        watched.database.run(rolled_back)

    assert watched.database.run(lambda conn: pg_driver.locked_job_rows(conn, JOB_LOCK, job_id)) == []


QUOTED = ["plain", "it's", "''", "'); DROP TABLE jobs; --", "back\\slash", "\\'", "naïve café 😀", "", "$1", "-- x",
          0, -5, 2**62, None, True, False, dt.datetime(2025, 1, 26, 10, 40, tzinfo=dt.UTC),
          dt.datetime(2026, 12, 3, 9, 4, 0, 123456, tzinfo=dt.timezone(dt.timedelta(hours=-5, minutes=-30)))]


# Documents, which pg_driver.literal quotes itself unless their JSON has a backslash (the
# last three: an escaped quote, a newline, a backslash), when psycopg does.
DOCUMENTS = [{"cluster": "c1"}, {}, [], {"it's": ["naïve café 😀", None, 1.5, True, {"'); --": "''"}]},
             {"say": 'a "quote"'}, {"lines": "a\nb"}, {"path": "C:\\dir"}]


@pytest.mark.parametrize("conforming", ["on", "off"])
def test_literals_read_back_as_the_values_they_quote(watched, conforming):
    # The write path quotes plain strings itself (pg_driver.literal): whatever a client
    # sends must come back unchanged, under either setting of standard_conforming_strings.
    def work(conn: Connection) -> list[Any]:
        driver = watched.watch(conn)
        conn.exec_driver_sql(f"SET LOCAL standard_conforming_strings = {conforming}")
        tx = Transformer.from_context(driver)
        values: list[Any] = [*QUOTED, *map(Jsonb, DOCUMENTS)]
        return [driver.execute(b"SELECT " + pg_driver.literal(tx, value)).fetchone()[0] for value in values]

    assert watched.database.run(work) == [*QUOTED, *DOCUMENTS]


def test_a_latin1_database_stores_what_a_utf8_client_sent(postgres):
    # The literals are UTF-8 bytes: the collector's connections say so whatever encoding
    # the database has, or "naïve" would be stored as "naÃ¯ve".
    name = f"collector_test_latin1_{uuid.uuid4().hex[:8]}"
    admin = create_engine(postgres.url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE \"{name}\" ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' "
                          "TEMPLATE template0"))
    url = make_url(postgres.url).set(database=name).render_as_string(hide_password=False)
    database = Database(Settings(database_url=url))
    try:
        upgrade(url)
        payload = JobUpdatePayload(status=JobStatus.BENCHMARK, message="naïve café", updated_at=dt.datetime.now(dt.UTC))
        database.run(lambda conn: job_store.update(conn, "latin1", payload), write=True)
        stored = database.run(lambda conn: conn.execute(text("SELECT message FROM jobs WHERE job_id = 'latin1'"))
                              .scalar_one())
        assert stored == "naïve café"
    finally:
        database.dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


# An upload at the end of a log: the lock, the job's rows and the file row with the chunks
# it overlaps in one query; then the file row and the chunk with COMMIT in one pipeline
# (the extended protocol: Parse on first use, Bind/Describe/Execute, the COMMIT's own,
# one Sync).
UPLOAD_EXTENDED = ["Bind", "Describe", "Execute", "Parse", "Bind", "Describe", "Execute", "Sync"]


def traced_upload(watched: Watched, trace_path, job_id: str, cluster: str | None, data: bytes, offset: int, *,
                  final: bool = False, prefetch: bool = True) -> tuple[Any, list[list[str]]]:
    """One log upload as api/logs.py runs it (``prefetch=False``: as it runs each chunk of a legacy list)."""
    now = dt.datetime.now(dt.UTC)

    def work(conn: Connection) -> log_store.Appended:
        first = log_store.prefetch(job_id, "logs/a.out", offset, data) if prefetch else None
        job_pk, _, _ = job_store.ensure(conn, job_id, cluster, now, prefetch=first)
        return log_store.append(conn, job_pk, "logs/a.out", offset, data, final=final, now=now, commit=True,
                                prefetched=first)

    return traced_waits(watched, trace_path, work)


def test_a_log_upload_is_two_round_trips_and_stores_its_bytes_as_sent(watched, postgres, tmp_path):
    job_id = f"pg-driver-{uuid.uuid4().hex[:8]}"
    now = dt.datetime.now(dt.UTC)
    watched.database.run(lambda conn: job_store.submit(conn, JobCreatePayload(
        job_id=job_id, job_name="probe", submitted_at=now, cluster="pg-driver")), write=True)
    # Every byte value, and the ones a literal would have to escape, sent as binary.
    data = bytes(range(256)) * 64 + b"\\x00'\0\\"
    trace = tmp_path / "libpq.trace"

    first, waits = traced_upload(watched, trace, job_id, "pg-driver", data, 0)
    assert first == log_store.Appended(True, len(data))
    # The general path (a first chunk, api/logs.py's attempt at the file's end declined):
    # the lock and read with the file's prefetch, then the write.
    assert waits == [["BEGIN", "PREPARE", "EXECUTE", "PREPARE", "EXECUTE"], ["Parse", *UPLOAD_EXTENDED]], waits
    second, waits = traced_upload(watched, trace, job_id, "pg-driver", data, len(data), final=True)
    assert second == log_store.Appended(True, len(data))
    assert waits == [["BEGIN", "EXECUTE", "EXECUTE"], UPLOAD_EXTENDED], waits
    # A resend of stored bytes changes nothing and writes nothing (SQLAlchemy commits the
    # reads once the unit of work returns).
    resent, waits = traced_upload(watched, trace, job_id, "pg-driver", data, 0)
    assert resent == log_store.Appended(False, 0)
    assert waits == [["BEGIN", "EXECUTE", "EXECUTE"]], waits
    # Without the prefetch (each chunk of a legacy JSON list) the file is a round trip of its own.
    resent, waits = traced_upload(watched, trace, job_id, "pg-driver", data, len(data), final=True, prefetch=False)
    assert resent == log_store.Appended(False, 0)
    assert waits == [["BEGIN", "EXECUTE"], ["PREPARE", "EXECUTE"]], waits

    assert watched.notices == [] and set(watched.status_at_checkin) == {TransactionStatus.IDLE}
    stored = watched.database.run(lambda conn: log_store.read(conn, postgres_job_pk(postgres, job_id), "logs/a.out", 0))
    assert (stored["size"], stored["final"]) == (2 * len(data), True)
    assert postgres.scalar(
        "SELECT string_agg(data, ''::bytea ORDER BY start_offset) FROM blob_chunks") == data + data


def test_a_prefetched_upload_reads_the_file_of_its_own_cluster_only(watched, postgres, tmp_path):
    # The prefetch reads the file of every job with the id (it runs before the job's
    # primary key is known); the upload must keep only its own job's, or it would check
    # its bytes against another cluster's.
    job_id = f"pg-driver-{uuid.uuid4().hex[:8]}"
    trace = tmp_path / "libpq.trace"
    mine, theirs = b"mine\n" * 100, b"theirs\n" * 100
    # The first upload creates the job: its placeholder row, event and count are one round trip more.
    created, waits = traced_upload(watched, trace, job_id, "cluster-a", mine, 0)
    assert created == log_store.Appended(True, len(mine))
    assert waits == [["BEGIN", "PREPARE", "EXECUTE", "PREPARE", "EXECUTE"], ["PREPARE", "EXECUTE"],
                     ["Parse", *UPLOAD_EXTENDED]], waits
    assert traced_upload(watched, trace, job_id, "cluster-b", theirs, 0)[0] == log_store.Appended(True, len(theirs))

    assert traced_upload(watched, trace, job_id, "cluster-a", mine, 0)[0] == log_store.Appended(False, 0)
    assert traced_upload(watched, trace, job_id, "cluster-b", theirs, 0)[0] == log_store.Appended(False, 0)
    with pytest.raises(Conflict, match="differ from the bytes already stored"):
        traced_upload(watched, trace, job_id, "cluster-b", mine, 0)
    with postgres.engine.connect() as conn:
        stored = dict(conn.execute(text(
            "SELECT j.cluster, string_agg(c.data, ''::bytea ORDER BY c.start_offset) FROM jobs j "
            "JOIN blob_files f ON f.job_pk = j.id JOIN blob_chunks c ON c.file_id = f.id "
            "WHERE j.job_id = :j GROUP BY j.cluster"), {"j": job_id}).all())
    assert stored == {"cluster-a": mine, "cluster-b": theirs}


def test_a_capture_chunk_is_two_round_trips_and_a_retry_only_reads(watched, postgres, tmp_path):
    job_id = f"pg-driver-{uuid.uuid4().hex[:8]}"
    now = dt.datetime.now(dt.UTC)
    watched.database.run(lambda conn: job_store.submit(conn, JobCreatePayload(
        job_id=job_id, job_name="probe", submitted_at=now, cluster="pg-driver")), write=True)
    halves = [bytes(range(256)) * 40, b"PAR1\0'\\" * 500]
    total = sum(map(len, halves))

    def chunk(offset: int, data: bytes) -> tuple[Any, list[list[str]]]:
        def work(conn: Connection) -> capture_store.Progress:
            first = capture_store.prefetch(job_id, "out-0.parquet", offset, data)
            job_pk, _, _ = job_store.ensure(conn, job_id, "pg-driver", now, prefetch=first)
            return capture_store.append(conn, job_pk, "out-0.parquet", offset, total, data, now=now, prefetched=first)
        return traced_waits(watched, tmp_path / "libpq.trace", work)

    progress, waits = chunk(0, halves[0])
    assert progress == capture_store.Progress(len(halves[0]), False, False, len(halves[0]))
    # The lock and read, first used on this connection (the POST before it made a new job
    # with statements of its own), with the file's prefetch; then the write.
    assert waits == [["BEGIN", "PREPARE", "EXECUTE", "PREPARE", "EXECUTE"], ["Parse", *UPLOAD_EXTENDED]], waits
    progress, waits = chunk(len(halves[0]), halves[1])
    assert progress == capture_store.Progress(total, True, True, len(halves[1]))
    assert waits == [["BEGIN", "EXECUTE", "EXECUTE"], UPLOAD_EXTENDED], waits
    # An exact retry of the first chunk gets the answer it had, from the reads alone.
    progress, waits = chunk(0, halves[0])
    assert progress == capture_store.Progress(len(halves[0]), False)
    assert waits == [["BEGIN", "EXECUTE", "EXECUTE"]], waits
    with pytest.raises(Conflict, match="differ from the stored segment"):
        chunk(0, halves[1][:len(halves[0])])

    assert watched.notices == [] and set(watched.status_at_checkin) == {TransactionStatus.IDLE}
    assert postgres.row("SELECT size, stored_end, total, done FROM blob_files WHERE name = 'out-0.parquet' "
                        "AND job_pk = :pk", pk=postgres_job_pk(postgres, job_id)) == (total, total, total, True)
    assert postgres.scalar("SELECT string_agg(c.data, ''::bytea ORDER BY c.start_offset) FROM blob_chunks c "
                           "JOIN blob_files f ON f.id = c.file_id WHERE f.job_pk = :pk",
                           pk=postgres_job_pk(postgres, job_id)) == b"".join(halves)


def postgres_job_pk(postgres, job_id: str) -> int:
    return postgres.scalar("SELECT id FROM jobs WHERE job_id = :j", j=job_id)


def test_a_failed_statement_with_bytes_leaves_the_connection_usable(watched, postgres):
    failing = pg_driver.statement(
        "collector_test_bytes", "SELECT length(%(data)s::bytea) / (%(n)s::int - 1) AS n")

    def run(n: int):
        def work(conn: Connection) -> list[dict[str, Any]]:
            watched.watch(conn)
            return pg_driver.execute_with_bytes(conn, failing, {"data": b"\0\xff" * 10, "n": n}, commit=True)
        return watched.database.run(work, write=True)

    with pytest.raises(DBAPIError) as failed:
        run(1)
    assert isinstance(failed.value.orig, psycopg.errors.DivisionByZero)
    assert not failed.value.connection_invalidated
    # Same connection, statement already prepared, transaction rolled back and reopened.
    assert run(3) == [{"n": 10}]
    assert len(watched.pids) == 1 and watched.notices == []


def test_a_backend_killed_before_a_statement_with_bytes_is_replayed_on_a_new_connection(watched, postgres):
    # The pipeline meets a dead socket: the error must say the connection is gone (the
    # pipeline left busy), so Database.run invalidates it and replays the unit of work.
    statement = pg_driver.statement("collector_test_bytes_length", "SELECT length(%(data)s::bytea) AS n")
    attempts: list[int] = []

    def work(conn: Connection) -> list[dict[str, Any]]:
        driver = watched.watch(conn)
        attempts.append(driver.info.backend_pid)
        if len(attempts) == 1:
            with postgres.engine.connect() as other:
                other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": driver.info.backend_pid})
        return pg_driver.execute_with_bytes(conn, statement, {"data": b"\0" * 300_000}, commit=True)

    assert watched.database.run(work, write=True) == [{"n": 300_000}]
    assert len(attempts) == 2 and attempts[0] != attempts[1]


def test_a_log_upload_where_its_file_ends_is_one_round_trip(watched, postgres, tmp_path):
    """collector_append_log_at_end() stores a streamer's next bytes in one round trip, and declines everything else.

    A declined attempt changes nothing: the general path (two round trips) then applies
    its own rules, so each case ends as it would without the attempt.
    """
    job_id, cluster = f"pg-log-{uuid.uuid4().hex[:8]}", "pg-log"
    now = dt.datetime.now(dt.UTC)

    def upload(offset: int, data: bytes, final: bool = False, on: str | None = cluster) -> tuple[Any, int]:
        result, waits = traced_waits(watched, tmp_path / "libpq.trace", lambda conn: log_store.upload(
            conn, job_id, on, [("w.out", offset, data, final)], now=now))
        return result, len(waits)

    def stored() -> tuple[Any, ...]:
        return postgres.row("SELECT f.size, f.stored_end, f.done, count(c.*) FROM jobs j JOIN blob_files f"
                            " ON f.job_pk = j.id LEFT JOIN blob_chunks c ON c.file_id = f.id WHERE j.job_id = :j"
                            " GROUP BY f.id", j=job_id)

    appended = log_store.Appended
    # No job or file yet: the attempt declines, the general path makes both (lock and
    # read, the placeholder, the file and its chunk).
    assert upload(0, b"abc") == ((True, [appended(True, 3)]), 4)
    assert upload(3, b"def") == ((False, [appended(True, 3)]), 1)
    assert stored() == (6, 6, False, 2)
    # Without a cluster, the job's only row: still one round trip.
    assert upload(6, b"gh", on=None) == ((False, [appended(True, 2)]), 1)
    assert stored() == (8, 8, False, 3)
    # A resend, a gap, bytes filling it, empty bytes, a final mark: the general path's rules decide.
    assert upload(3, b"def") == ((False, [appended(False, 0)]), 2)  # and COMMIT, after the trace
    assert upload(12, b"mn") == ((False, [appended(True, 2)]), 3)
    assert stored() == (8, 14, False, 4)
    assert upload(8, b"ijkl") == ((False, [appended(True, 4)]), 6)  # a gap closed: a statement per step
    assert stored() == (14, 14, False, 5)
    assert upload(14, b"") == ((False, [appended(False, 0)]), 1)  # nothing to send: no attempt
    assert upload(14, b"", final=True) == ((False, [appended(True, 0)]), 2)
    assert stored() == (14, 14, True, 5)
    assert postgres.scalar("SELECT string_agg(c.data, '' ORDER BY c.start_offset) FROM jobs j JOIN blob_files f"
                           " ON f.job_pk = j.id JOIN blob_chunks c ON c.file_id = f.id WHERE j.job_id = :j",
                           j=job_id) == b"abcdefghijklmn"
    # Once final, even bytes at the end go the general way, which refuses them.
    with pytest.raises(Conflict, match=r"bytes 14-16 of w.out lie past the end it was finalized at \(14\)"):
        upload(14, b"op")
    assert stored() == (14, 14, True, 5)


# Documents as reporters send them: nested objects, nulls for "unknown", lists, type changes.
MERGES: list[tuple[Any, Any]] = [
    (None, None), (None, {}), ({"a": 1}, None), ({"a": 1}, {}), (None, {"a": None}), ({"a": 1}, {"a": None}),
    ({"a": None}, {"a": 2}), ({"a": None}, {"a": None}), ({"a": 1}, {"b": 2}),
    ({"a": {"b": 1, "c": None}}, {"a": {"c": 3, "d": None, "b": None}}), ({"a": {"b": 1}}, {"a": 5}),
    ({"a": 5}, {"a": {"b": 1}}), ({"a": [1, 2]}, {"a": [3]}), ({"a": {}}, {"a": {}}),
    ({"x": "s", "y": {"z": {"w": 1}}}, {"x": "t", "y": {"z": {"w": None, "v": [None]}}}),
]


@pytest.mark.parametrize("base_wins", [False, True], ids=["put", "late-put"])
def test_the_put_statement_merges_documents_as_the_python_rules_do(postgres, base_wins):
    """collector_merged() (revision 0016) against jobs._merged, which SQLite and the general path run."""
    for base, patch in MERGES:
        expected = job_store._merged(base, patch, existing_wins=base_wins)
        merged = postgres.scalar("SELECT collector_merged(CAST(:base AS jsonb), CAST(:patch AS jsonb), :wins)",
                                 base=None if base is None else json.dumps(base),
                                 patch=None if patch is None else json.dumps(patch), wins=base_wins)
        assert merged == expected, (base, patch)


def _document(rng: random.Random, depth: int = 0) -> Any:
    """A small JSON object of the shapes reporters send: nested objects, nulls, lists, scalars."""
    def value() -> Any:
        kind = rng.randrange(6 if depth < 2 else 5)
        if kind == 5:
            return _document(rng, depth + 1)
        return [None, rng.randrange(3), rng.choice(["x", "y", ""]), [rng.randrange(2), None], {}][kind]
    return {key: value() for key in rng.sample(["a", "b", "c", "job_name"], rng.randrange(4))}


def _random_put(rng: random.Random, at: dt.datetime, cluster: str) -> JobUpdatePayload:
    def maybe(make: Any) -> Any:
        return make() if rng.random() < 0.4 else None

    metadata = maybe(lambda: _document(rng))
    if metadata is not None and rng.random() < 0.5:
        metadata["job_name"] = rng.choice(["named", "renamed", 7, None])
    if metadata is not None and rng.random() < 0.5:
        metadata["cluster"] = cluster
    return JobUpdatePayload(
        status=rng.choice(list(JobStatus)), updated_at=at, stage=maybe(lambda: rng.choice(list(JobStage))),
        message=maybe(lambda: rng.choice(["", "up", "down"])),
        started_at=maybe(lambda: at - dt.timedelta(seconds=rng.randrange(100))),
        completed_at=maybe(lambda: at), exit_code=maybe(lambda: rng.choice([0, 1, -9])),
        logs_url=maybe(lambda: rng.choice(["", "file:///l"])), benchmark_results=maybe(lambda: _document(rng)),
        artifacts=maybe(lambda: _document(rng)), metadata=metadata)


def test_random_puts_land_alike_through_the_put_statement_and_the_python_rules(postgres, monkeypatch):
    """collector_put_job() (revisions 0016, 0017) against the general path that SQLite and every other case run.

    The same job id on two clusters gets the same random PUTs (some late, some before any
    POST): on one the way a PUT goes, the statement whenever it applies; on the other forced
    down the Python rules (a PUT with ``event_at`` never takes the statement). Every answer,
    row, event and count must come out the same.
    """
    postgres.clean()
    database = Database(Settings(database_url=postgres.url))
    rng = random.Random(20261207)
    start = dt.datetime(2026, 12, 7, tzinfo=dt.UTC)
    statement, python = "diff-statement", "diff-python"
    # Which PUTs the statement applied (it returns None where it declines), counted as they
    # pass: the comparison means something only if it applied most of them.
    applied = []
    put_stored = writes.put_stored

    def counted(*args: Any, **kwargs: Any) -> Any:
        found = put_stored(*args, **kwargs)
        applied.append(found is not None)
        return found

    monkeypatch.setattr(writes, "put_stored", counted)
    try:
        for trial in range(60):
            job_id = f"diff-{trial}"
            at = start + dt.timedelta(hours=trial)
            if rng.random() < 0.7:  # else the first PUT makes a placeholder, whose name a PUT may then set
                for cluster in (statement, python):
                    post = JobCreatePayload(job_id=job_id, job_name="posted", submitted_at=at, cluster=cluster)
                    database.run(functools.partial(job_store.submit, payload=post), write=True)
            for _ in range(rng.randrange(1, 7)):
                at += dt.timedelta(seconds=rng.choice([30, 30, 30, -90]))  # one in four is late
                put = _random_put(rng, at, statement)
                answers = []
                for cluster, event_at in ((statement, None), (python, put.updated_at)):
                    if put.metadata and "cluster" in put.metadata:
                        put = put.model_copy(update={"metadata": {**put.metadata, "cluster": cluster}})
                    result = database.run(functools.partial(job_store.update, job_id=job_id, payload=put,
                                                            cluster=cluster, event_at=event_at, credential="tok"),
                                          write=True)
                    answers.append((result.status, result.late, result.event is not None and
                                    (result.event.status, result.event.stage, result.event.message)))
                assert answers[0] == answers[1], (trial, put)
    finally:
        database.dispose()

    def stored(cluster: str) -> tuple[list[Any], list[Any]]:
        with postgres.engine.connect() as conn:
            jobs = conn.execute(text(
                "SELECT job_id, job_name, is_placeholder, status, stage, message, recipe, submitted_at, started_at,"
                " completed_at, updated_at, exit_code, logs_url, benchmark_results, artifacts, metadata"
                " FROM jobs WHERE cluster = :c ORDER BY job_id"), {"c": cluster}).mappings().all()
            events = conn.execute(text(
                "SELECT j.job_id, e.status, e.stage, e.message, e.created_at, e.credential FROM job_events e"
                " JOIN jobs j ON j.id = e.job_pk WHERE j.cluster = :c ORDER BY j.job_id, e.id"), {"c": cluster}).all()
        # The clusters differ, and so does metadata.cluster where a PUT repeated it.
        return ([{**row, "metadata": {**row["metadata"], "cluster": "-"}}
                 if row["metadata"] and "cluster" in row["metadata"] else dict(row) for row in jobs], list(events))

    assert stored(statement) == stored(python)
    assert len(applied) > 150 and sum(applied) > len(applied) / 2, (sum(applied), len(applied))
    with postgres.engine.connect() as conn:
        by_cluster = counts.by_cluster(conn)
    assert by_cluster[statement] == by_cluster[python]
    postgres.assert_counts_match_jobs()
