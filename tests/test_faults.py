"""The fault suite: kill workers and servers, drop database connections, reset clients, under load.

Each scenario runs a load (tests/faultload.py) that records every acknowledged write, injects
its fault, and then has the verifier compare every acknowledged write with what is stored:
events in order and without duplicates, final statuses, log bytes, job_counts, and the
feed paged with ``after=``. Run with ``-s`` to see the figures docs/operations.md quotes
("Failure modes"); each line starts with ``FAULTS``.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import os
import pwd
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests
from sqlalchemy import create_engine
from sqlalchemy import text
from sqlalchemy.pool import NullPool

from collector.migrations import upgrade
from collector.store import deliveries
from tests import sse
from tests.faultload import Load
from tests.faultload import Write
from tests.faultload import stamp
from tests.faultload import verify
from tests.helpers import wait_for
from tests.processes import ServerProcess
from tests.processes import child_env
from tests.processes import collector_command
from tests.processes import workers_of

pytestmark = pytest.mark.faults

GUNICORN = [sys.executable, "-m", "gunicorn", "-c", "deploy/gunicorn.conf.py", "collector.wsgi:app"]


def figure(text_: str) -> None:
    """A measured figure, for docs/operations.md (shown with ``pytest -s``)."""
    print(f"\nFAULTS {text_}", flush=True)


def quiet_env(**extra: str) -> dict[str, str]:
    # The load sends thousands of requests: their access lines would only cost CPU.
    return child_env(COLLECTOR_ACCESS_LOG_LEVEL="warning", **extra)


def gunicorn(url: str, *, workers: int = 2, **extra: str) -> ServerProcess:
    """gunicorn with the shipped config, as deployments run it, on an ephemeral port."""
    extra.setdefault("COLLECTOR_MAX_STREAMS", "16")
    extra.setdefault("COLLECTOR_LOG_LEVEL", "warning")  # one line per transition otherwise
    return ServerProcess(GUNICORN, quiet_env(COLLECTOR_DATABASE_URL=url, COLLECTOR_PORT="0",
                                             COLLECTOR_WORKERS=str(workers), **extra))


def assert_stored(report, load: Load, *, events: int | None = None) -> None:
    """Nothing acknowledged is lost; ``events``: how many the verifier must at least have seen."""
    assert not load.rejections, [(w.kind, w.job_id, s, e) for w, s, e in load.rejections[:5]]
    assert report.problems == [], str(report)
    # The verifier saw what the load did: a check that cannot have looked at nothing.
    assert report.events >= (len([w for w in load.acked if w.changes_job]) if events is None else events)
    # Bytes too: at least what was acknowledged (a chunk whose answer was lost may be stored as well).
    assert report.log_bytes >= sum(len(w.data) for w in load.acked if w.kind == "log")
    assert report.capture_bytes >= sum(len(w.data) for w in load.acked if w.kind == "capture")


# --- the verifier can fail ------------------------------------------------------------------


def test_the_verifier_reports_a_deleted_event_and_altered_bytes(database, serve):
    api = serve()
    load = Load(api.url, prefix="control-", threads=3, jobs=6).start().wait()
    report = verify(database.engine, load.writes, url=api.url)
    assert report.problems == [], str(report)
    assert len(load.acked) == 6 * 13 and report.jobs == 6 and report.events == 6 * 8
    assert report.capture_bytes == sum(len(w.data) for w in load.acked if w.kind == "capture") > 0

    victim = next(w for w in load.acked if w.job_id == "control-2" and w.triple == ("workers", "workers",
                                                                                      "Starting workers"))
    with database.engine.begin() as conn:
        deleted = conn.execute(text(
            "DELETE FROM job_events WHERE status = 'workers' AND job_pk = "
            "(SELECT id FROM jobs WHERE job_id = 'control-2')")).rowcount
    assert deleted == 1
    report = verify(database.engine, load.writes, url=api.url)
    assert report.problems == [f"control-2: acknowledged put {victim.triple} has no event"], str(report)

    first_chunk = next(w for w in load.acked if w.job_id == "control-4" and w.kind == "log" and w.offset == 0)
    with database.engine.begin() as conn:
        # Same length, other bytes: only the comparison with what was acknowledged can see it.
        conn.execute(text(
            "UPDATE blob_chunks SET data = :data WHERE start_offset = 0 AND file_id = "
            "(SELECT f.id FROM blob_files f JOIN jobs j ON j.id = f.job_pk WHERE j.job_id = 'control-4' "
            "AND f.kind = 'log')"), {"data": b"x" * len(first_chunk.data)})
        # The second half of a capture segment lost: the file row still says it is all there.
        conn.execute(text(
            "DELETE FROM blob_chunks WHERE start_offset > 0 AND file_id = "
            "(SELECT f.id FROM blob_files f JOIN jobs j ON j.id = f.job_pk WHERE j.job_id = 'control-5' "
            "AND f.kind = 'capture')"))
        # One job too many, in whichever table holds the pair's count on this backend.
        conn.execute(text("INSERT INTO job_counts (cluster, status, jobs) VALUES ('faults', 'completed', 1) "
                          "ON CONFLICT (cluster, status) DO UPDATE SET jobs = job_counts.jobs + 1"))
    problems = verify(database.engine, load.writes, url=api.url).problems
    segment = [w for w in load.acked if w.job_id == "control-5" and w.kind == "capture"]
    total, half = segment[0].total, segment[1].offset
    assert len(problems) == 6, "\n".join(problems)
    assert problems[0] == f"control-2: acknowledged put {victim.triple} has no event"
    assert problems[1].startswith("control-4 logs/worker-0.out: ") and problems[1].endswith("differ from byte 0")
    assert problems[2:5] == [
        f"control-5 captures/out-0.parquet: size {total}, {half} bytes stored",
        f"control-5 captures/out-0.parquet: done is True at {half} of {total}",
        f"control-5 captures/out-0.parquet: {half} bytes stored, {total} acknowledged; they differ from byte {half}",
    ]
    assert problems[5].startswith("the counts ")


# --- 1. kill -9 of a worker ------------------------------------------------------------------


def replaced_worker(server: ServerProcess, master: int, booted: str, before: int, victim: int) -> bool:
    """Whether gunicorn booted a worker since ``before`` boots and runs two again, ``victim`` not among them."""
    return (server.output.count(booted) > before and len(workers_of(master)) == 2
            and victim not in workers_of(master))


def test_kill_9_of_a_gunicorn_worker_under_load(database):
    database.clean()
    server = gunicorn(database.url, workers=2)
    try:
        master = server.proc.pid
        wait_for(lambda: len(workers_of(master)) == 2, 20, "two workers")
        load = Load(server.url, prefix="kill-", threads=6, unposted=3).start()
        replaced = []
        for _ in range(3):
            time.sleep(1.5)
            replaced.append(kill_a_worker(server, master))
        time.sleep(1.0)
        load.stop()
        report = verify(database.engine, load.writes, url=server.url)
    finally:
        server.stop()
    figure(f"kill -9 worker ({database.url.split(':')[0]}): 3 kills; replacement booted after "
           f"{', '.join(f'{r:.2f}' for r in replaced)} s; {load.summary()}; {report}")
    assert_stored(report, load)
    database.assert_counts_match_jobs()
    # Every failure is a request the dead worker held: no answer, never a 5xx.
    assert {a.status for _, a in load.failures} <= {None}, load.failure_kinds()


# --- 2. backends terminated ------------------------------------------------------------------

TERMINATE = ("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = current_database() "
             "AND pid <> pg_backend_pid() AND backend_type = 'client backend'")


def terminate_rounds(postgres, rounds: int = 8, every_s: float = 0.6) -> list[int]:
    """Terminate every client backend of the database ``rounds`` times, ``every_s`` apart; how many each time."""
    terminated = []
    for _ in range(rounds):
        time.sleep(every_s)
        with postgres.engine.connect() as conn:
            terminated.append(conn.execute(text(TERMINATE)).scalar())
    return terminated


def test_backends_terminated_under_load_answer_no_5xx(postgres):
    postgres.clean()
    server = gunicorn(postgres.url, workers=2)
    try:
        load = Load(server.url, prefix="term-", threads=6, unposted=3).start()
        terminated = terminate_rounds(postgres)
        time.sleep(0.5)
        load.stop()
        report = verify(postgres.engine, load.writes, url=server.url)
    finally:
        server.stop()
    figure(f"backends terminated: {sum(terminated)} backends in 8 rounds {terminated}; {load.summary()}; {report}")
    assert min(terminated) >= 1  # every round found the workers' connections to kill
    assert_stored(report, load)
    postgres.assert_counts_match_jobs()
    assert load.failure_kinds() == {}  # replayed on a fresh connection: not one 5xx, not one reset


# --- 3. PostgreSQL restart --------------------------------------------------------------------


class PrivatePostgres:
    """A PostgreSQL instance of this test's own (the shared server is never restarted)."""

    def __init__(self, bindir: Path, root: Path, port: int) -> None:
        self.bindir, self.root, self.port = bindir, root, port
        self.data = root / "data"
        self.url = f"postgresql+psycopg://postgres@/postgres?host={root}&port={port}"

    def pg_ctl(self, *args: str) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=''"
        as_postgres(self.root, str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "log"),
                    "-o", options, "-w", "-t", "20", *args)


def as_postgres(cwd: Path, *args: str) -> None:
    result = subprocess.run(["runuser", "-u", "postgres", "--", *args], cwd=cwd, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, f"{args[0]} failed:\n{result.stdout}\n{result.stderr}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def private_postgres(postgres):
    """initdb + pg_ctl as the postgres user in a temporary directory, on a free port, unix socket only."""
    bins = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    if os.geteuid() != 0:
        pytest.skip("a private PostgreSQL runs as the postgres user: needs root (runuser)")
    if not bins or shutil.which("runuser") is None:
        pytest.skip("a private PostgreSQL needs /usr/lib/postgresql/*/bin/{initdb,pg_ctl} and runuser")
    try:
        user = pwd.getpwnam("postgres")
    except KeyError:
        pytest.skip("a private PostgreSQL needs a postgres user")
    # Not under pytest's tmp_path: its parents are closed to the postgres user.
    root = Path(tempfile.mkdtemp(prefix="collector-pg-"))
    os.chown(root, user.pw_uid, user.pw_gid)
    server = PrivatePostgres(bins[-1].parent, root, free_port())
    try:
        as_postgres(root, str(server.bindir / "initdb"), "-D", str(server.data), "-U", "postgres", "-A", "trust",
                    "-E", "UTF8", "--no-sync")
        server.pg_ctl("start")
        yield server
    finally:
        if (server.data / "postmaster.pid").exists():
            server.pg_ctl("-m", "immediate", "stop")
        shutil.rmtree(root, ignore_errors=True)


def test_postgresql_restart_recovers_without_restarting_gunicorn(private_postgres):
    pg = private_postgres
    upgrade(pg.url)
    engine = create_engine(pg.url, poolclass=NullPool)
    server = gunicorn(pg.url, workers=2)
    try:
        master = server.proc.pid
        workers = wait_for(lambda: len(workers_of(master)) == 2 and workers_of(master), 20, "two workers")
        load = Load(server.url, prefix="restart-", threads=6, retry_for=20, unposted=3).start()
        time.sleep(2.0)
        stopping = time.monotonic()
        pg.pg_ctl("-m", "fast", "stop")
        stopped = time.monotonic()
        while_down = []
        while time.monotonic() - stopped < 1.5:
            response = requests.get(server.url + "/api/ready", timeout=5)
            while_down.append((response.status_code, response.headers.get("Retry-After")))
            time.sleep(0.2)
        pg.pg_ctl("start")
        started = time.monotonic()
        ready = wait_for(lambda: requests.get(server.url + "/api/ready", timeout=5).status_code == 200
                           and time.monotonic(), 10, "/api/ready to answer 200 again")
        first_ack = wait_for(lambda: load.first_ack_after(started), 10, "a write acknowledged after the restart")
        time.sleep(1.5)
        load.stop()
        report = verify(engine, load.writes, url=server.url)
        assert workers_of(master) == workers  # the same master and workers: gunicorn was not restarted
    finally:
        server.stop()
        engine.dispose()
    first_write = first_ack - started
    figure(f"PostgreSQL restart: stop took {stopped - stopping:.2f} s, held down 1.5 s, start took "
           f"{started - stopped - 1.5:.2f} s; after start, ready 200 in {ready - started:.2f} s and the first write "
           f"acknowledged in {first_write:.2f} s; ready while down {sorted(set(while_down))}; "
           f"{load.summary()}; {report}")
    assert while_down and all(status == 503 and retry for status, retry in while_down), while_down
    assert ready - started < 5 and first_write < 5
    assert_stored(report, load)
    # What writes saw while the database was down: 503 with Retry-After, never a 500 or a reset.
    assert {a.status for _, a in load.failures} <= {503}, load.failure_kinds()
    assert all(a.retry_after for _, a in load.failures)


# --- 4. kill -9 of collector serve --------------------------------------------------------------


def test_kill_9_of_collector_serve_on_sqlite(tmp_path):
    # SQLite in both runs: `collector serve` on a file is the single-user mode this is about.
    path = tmp_path / "serve.db"
    args = collector_command("serve", "--port", "0", "--db", str(path))
    server = ServerProcess(args, quiet_env())
    load = Load(server.url, prefix="serve-", threads=4, retry_for=20, unposted=3).start()
    try:
        time.sleep(2.5)
        os.killpg(server.proc.pid, signal.SIGKILL)  # the whole process group: a worker must not outlive it
        killed = time.monotonic()
        server.proc.wait(timeout=10)
        server.stop()
        acked_before = len(load.acked)
        server = ServerProcess(args, quiet_env())
        load.url = server.url
        restarted = time.monotonic()
        first_ack = wait_for(lambda: load.first_ack_after(restarted), 10, "a write acknowledged after the restart")
        time.sleep(1.5)
        load.stop()
        engine = create_engine(f"sqlite:///{path}", poolclass=NullPool)
        report = verify(engine, load.writes, url=server.url)
        engine.dispose()
    finally:
        load.stop()
        server.stop()
    figure(f"kill -9 collector serve (SQLite): {acked_before} writes acknowledged before the kill; restart "
           f"listening after {restarted - killed:.2f} s, first write acknowledged "
           f"{first_ack - killed:.2f} s after the kill; {load.summary()}; {report}")
    assert acked_before > 20
    assert_stored(report, load)


# --- 5. read-then-reset clients ---------------------------------------------------------------


def read_answer(sock: socket.socket) -> int:
    """Read one HTTP answer with a Content-Length body; its status."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed before the answer's head")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next(int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed mid-body")
        body += chunk
    return int(lines[0].split()[1])


def reset(sock: socket.socket) -> None:
    """Close with an RST, as a killed client or a load tool does."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


PARTIAL_PUT = (b"PUT /api/jobs/reset-%d HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: 1000\r\n\r\n")


def reset_clients(address: tuple[str, int]) -> dict[str, int]:
    """1,000 read-then-reset clients, then clients that reset mid-body, mid-response and before the body."""
    done = {"read then reset": 0, "reset mid-body": 0, "reset before the body": 0, "reset mid-response": 0}
    hung = threading.Event()
    lock = threading.Lock()

    def read_then_reset(count: int) -> None:
        for _ in range(count):
            if hung.is_set():
                return
            sock = socket.create_connection(address, timeout=3)
            try:
                sock.sendall(b"GET /api/health HTTP/1.1\r\nHost: x\r\n\r\n")
                assert read_answer(sock) == 200
            except (OSError, AssertionError):
                hung.set()
                raise
            finally:
                reset(sock)
            with lock:
                done["read then reset"] += 1

    threads = [threading.Thread(target=read_then_reset, args=(250,)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not hung.is_set(), f"the server stopped answering after {done['read then reset']} read-then-reset clients"
    assert done["read then reset"] == 1000

    number = 0
    for kind, payload in (("reset mid-body", b'{"status": '), ("reset before the body", b"")):
        for _ in range(4):  # batches, so the server is blocked reading their bodies when they reset
            batch = []
            for _ in range(50):
                sock = socket.create_connection(address, timeout=3)
                sock.sendall(PARTIAL_PUT % number + payload[:10])
                number += 1
                batch.append(sock)
            time.sleep(0.2)
            for sock in batch:
                reset(sock)
                done[kind] += 1
    for _ in range(100):
        sock = socket.create_connection(address, timeout=3)
        sock.sendall(b"GET /api/openapi.json HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.recv(100)
        reset(sock)
        done["reset mid-response"] += 1
    return done


@pytest.mark.parametrize("kind", ["collector serve", "gunicorn"])
def test_clients_that_reset_leave_every_slot_free(database, tmp_path, kind):
    database.clean()
    if kind == "gunicorn":
        # One worker: every leaked slot would be that worker's.
        server, url = gunicorn(database.url, workers=1), database.url
    else:
        # `collector serve` on a SQLite file in both runs: one worker by default, where issue 14 saw the hang.
        url = f"sqlite:///{tmp_path / 'serve.db'}"
        server = ServerProcess(collector_command("serve", "--port", "0", "--db", url), quiet_env())
    engine = create_engine(url, poolclass=NullPool)
    try:
        parts = urlsplit(server.url)
        began = time.monotonic()
        assert parts.hostname is not None and parts.port is not None
        done = reset_clients((parts.hostname, parts.port))
        spent = time.monotonic() - began
        answered = time.monotonic()
        health = requests.get(server.url + "/api/health", timeout=1)
        health_s = time.monotonic() - answered
        answered = time.monotonic()
        put = requests.put(server.url + "/api/jobs/after-resets", timeout=1, json={
            "status": "starting", "updated_at": stamp(dt.datetime.now(dt.UTC))})
        put_s = time.monotonic() - answered
        load = Load(server.url, prefix="after-", threads=4, jobs=8).start().wait()
        report = verify(engine, load.writes, url=server.url)
        with engine.connect() as conn:
            reset_jobs = conn.execute(text("SELECT count(*) FROM jobs WHERE job_id LIKE 'reset-%'")).scalar()
    finally:
        server.stop()
        engine.dispose()
    figure(f"reset clients ({kind}): {done} in {spent:.1f} s; then health answered in {health_s * 1000:.0f} ms, "
           f"a PUT in {put_s * 1000:.0f} ms; {load.summary()}")
    assert health.status_code == 200 and put.status_code == 200
    assert health_s < 1 and put_s < 1
    assert reset_jobs == 0  # no half-sent body was ever taken for a write
    # A client gone mid-body is its own doing (a 400 nobody reads), never a server error.
    assert "Traceback" not in server.output, server.output[-3000:]
    assert load.failure_kinds() == {}
    assert_stored(report, load)


# --- 6. late PUTs -------------------------------------------------------------------------------


def test_a_late_put_never_moves_a_finished_job_back(database):
    database.clean()
    server = gunicorn(database.url, workers=2)
    try:
        base = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(hours=1)
        t2, t3 = base + dt.timedelta(minutes=2), base + dt.timedelta(minutes=3)
        assert requests.post(server.url + "/api/jobs", timeout=5, json={
            "job_id": "late-0", "job_name": "n", "submitted_at": stamp(base), "cluster": "faults"}).status_code == 201
        done = requests.put(server.url + "/api/jobs/late-0", timeout=5, json={
            "status": "completed", "stage": "cleanup", "message": "Benchmark completed successfully",
            "updated_at": stamp(t3), "exit_code": 0, "metadata": {"cluster": "faults"}})
        assert done.status_code == 200
        before = database.scalar("SELECT count(*) FROM job_events")
        late = requests.put(server.url + "/api/jobs/late-0", timeout=5, json={
            "status": "benchmark", "stage": "benchmark", "message": "Running benchmark", "updated_at": stamp(t2),
            "metadata": {"cluster": "faults"}})
        assert late.status_code == 200 and late.json()["status"] == "completed"
        assert database.scalar("SELECT count(*) FROM job_events") == before
        with database.engine.connect() as conn:
            row = conn.execute(text("SELECT status, stage, message, exit_code FROM jobs WHERE job_id = 'late-0'")).one()
        assert tuple(row) == ("completed", "cleanup", "Benchmark completed successfully", 0)

        # The same under load: every job's PUTs in a random order, from racing threads.
        load = Load(server.url, prefix="shuffled-", jobs=0)
        plans = [load.job_writes(n) for n in range(40)]
        for plan in plans:
            assert load.send(plan[0])
            load.writes.append(plan[0])
        puts = [w for plan in plans for w in plan if w.kind == "put"]
        random.Random(6).shuffle(puts)
        load.writes.extend(puts)
        queue = list(puts)
        lock = threading.Lock()

        def sender() -> None:
            rand = random.Random()
            while True:
                with lock:
                    if not queue:
                        return
                    write = queue.pop()
                time.sleep(rand.random() * 0.02)
                load.send(write)

        threads = [threading.Thread(target=sender) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        report = verify(database.engine, load.writes, url=server.url, ordered=False)
        with database.engine.connect() as conn:
            statuses = dict(conn.execute(text(
                "SELECT status, count(*) FROM jobs WHERE job_id LIKE 'shuffled-%' GROUP BY status")).all())
    finally:
        server.stop()
    # Late ones happened: a PUT sent after a newer one of its job had been acknowledged.
    late_sent = sum(1 for old in puts for new in puts
                    if old.job_id == new.job_id and old.moment < new.moment
                    and old.attempts[0].started > new.attempts[-1].ended)
    figure(f"late PUTs: {len(puts)} PUTs of 40 jobs shuffled, {late_sent} sent after a newer one was acknowledged; "
           f"final statuses {statuses}; {load.summary()}; {report}")
    assert late_sent > 0
    assert all(w.acked for w in puts) and statuses == {"completed": 40}
    assert_stored(report, load, events=40 * 2)  # each job's submitted and completed, at least
    database.assert_counts_match_jobs()


# --- 7. queue-timeout shedding --------------------------------------------------------------------


def trickled_put(address: tuple[str, int], seconds: float) -> int:
    """A PUT whose body arrives a byte at a time over ``seconds``: it holds a slot that long; its status."""
    body = (b'{"status": "starting", "stage": "starting", "message": "slow", "updated_at": "'
            + stamp(dt.datetime.now(dt.UTC)).encode() + b'"}').ljust(100)
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(b"PUT /api/jobs/shed-holder HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body))
        for byte in range(len(body)):
            sock.sendall(body[byte:byte + 1])
            time.sleep(seconds / len(body))
        return read_answer(sock)


def test_requests_that_waited_past_the_queue_timeout_are_shed_not_run(database):
    database.clean()
    server = gunicorn(database.url, workers=1, COLLECTOR_THREADS="1", COLLECTOR_QUEUE_TIMEOUT="1")
    try:
        parts = urlsplit(server.url)
        holder: list[int] = []
        host, port = parts.hostname, parts.port
        assert host is not None and port is not None
        address = (host, port)
        hold = threading.Thread(target=lambda: holder.append(trickled_put(address, 3.0)))
        hold.start()
        time.sleep(0.4)
        load = Load(server.url, prefix="", jobs=0)

        def wave(name: str) -> list[Write]:
            writes = [Write("put", f"{name}-{n}", 1, dt.datetime.now(dt.UTC).replace(microsecond=0),
                            ("starting", "starting", "Job started"),
                            body={"status": "starting", "stage": "starting", "message": "Job started",
                                  "updated_at": stamp(dt.datetime.now(dt.UTC).replace(microsecond=0)),
                                  "metadata": {"cluster": "faults"}}) for n in range(10)]
            threads = [threading.Thread(target=load.send, args=(w,), kwargs={"retry": False}) for w in writes]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=20)
            load.writes.extend(writes)
            return writes

        shed = wave("shed-a")  # queued behind the held slot for more than a second
        hold.join(timeout=20)
        served = wave("shed-b")  # the slot is free again
        report = verify(database.engine, load.writes, url=server.url)
        with database.engine.connect() as conn:
            stored = {j for (j,) in conn.execute(text("SELECT job_id FROM jobs WHERE job_id LIKE 'shed-%'"))}
    finally:
        server.stop()
    answers = [(w.attempts[0].status, w.attempts[0].retry_after) for w in shed]
    waits = [w.attempts[0].ended - w.attempts[0].started for w in shed]
    figure(f"queue timeout 1 s, 1 slot held 3 s: first wave answered {sorted(set(answers), key=str)} after "
           f"{min(waits):.2f}-{max(waits):.2f} s; second wave {[w.attempts[0].status for w in served]}; {report}")
    assert holder == [200]
    assert [status for status, _ in answers] == [503] * 10, answers  # every one shed...
    assert all(retry_after for _, retry_after in answers), answers  # ...with Retry-After
    assert all(w.attempts[0].status == 200 for w in served)
    assert stored == {"shed-holder"} | {w.job_id for w in served}  # not one shed PUT ran
    assert report.problems == [], str(report)


# --- 8. kill -9 of a worker during a token rotation --------------------------------------------


class RotatingLoad(Load):
    """A Load whose token can be switched, knowing which threads have finished a write with the new one."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.moved: set[str] = set()

    def switch(self, token: str) -> None:
        self.moved = set()
        self.token = token

    def all_moved(self) -> bool:
        return len(self.moved) == self.threads

    def _attempt(self, write: Write):
        token = self.token  # read before the request is: a switch in between leaves the thread unmoved
        attempt = super()._attempt(write)
        if token == self.token:
            self.moved.add(threading.current_thread().name)
        return attempt


def token_command(path: Path, *args: str) -> str:
    """`collector token ARGS --file PATH`, as an operator runs it; its stdout."""
    done = subprocess.run(collector_command("token", *args, "--file", str(path)), env=child_env(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def kill_a_worker(server: ServerProcess, master: int) -> float:
    """kill -9 one worker and wait for its replacement; how long that took."""
    victim = random.choice(workers_of(master))
    booted = "Booting worker with pid: "
    before = server.output.count(booted)
    os.kill(victim, signal.SIGKILL)
    killed = time.monotonic()
    wait_for(functools.partial(replaced_worker, server, master, booted, before, victim), 15, "a replacement worker")
    return time.monotonic() - killed


def test_kill_9_of_a_worker_during_a_token_rotation(database, tmp_path):
    # Writers use a scoped credential from the tokens file; it is rotated while workers die,
    # so replacements must read the file as it is then, and every survivor notice the change.
    database.clean()
    path = tmp_path / "tokens.json"
    old = token_command(path, "add", "faults-old", "--role", "write", "--cluster", "faults").splitlines()[-1]
    server = gunicorn(database.url, workers=2, COLLECTOR_TOKENS_FILE=str(path))
    try:
        master = server.proc.pid
        wait_for(lambda: len(workers_of(master)) == 2, 20, "two workers")
        load = RotatingLoad(server.url, prefix="rotate-", threads=6, token=old)
        load.start()
        wait_for(lambda: len(load.acked) >= 40, 15, "writes with the old token")
        replaced = [kill_a_worker(server, master)]
        new = token_command(path, "add", "faults-new", "--role", "write", "--cluster", "faults").splitlines()[-1]
        load.switch(new)
        replaced.append(kill_a_worker(server, master))
        wait_for(load.all_moved, 15, "every load thread to write with the new token")
        token_command(path, "remove", "faults-old")
        removed = time.monotonic()
        # Refused everywhere: several refusals in a row, on fresh connections to either worker.
        wait_for(lambda: all(requests.get(server.url + "/api/jobs", headers={"Authorization": f"Bearer {old}"},
                                          timeout=5).status_code == 401 for _ in range(8)), 5, "the old token refused")
        refused_after = time.monotonic() - removed
        acked = len(load.acked)
        replaced.append(kill_a_worker(server, master))
        wait_for(lambda: len(load.acked) >= acked + 40, 15, "writes after the removal")
        load.stop()
        report = verify(database.engine, load.writes, url=server.url, token=new)
    finally:
        server.stop()
    figure(f"kill -9 worker during a token rotation ({database.url.split(':')[0]}): 3 kills, replacement booted "
           f"after {', '.join(f'{r:.2f}' for r in replaced)} s; old token refused everywhere "
           f"{refused_after:.2f} s after its removal; {load.summary()}; {report}")
    assert_stored(report, load)
    database.assert_counts_match_jobs()
    assert not [a for w in load.writes for a in w.attempts if a.status in (401, 403)]
    assert {a.status for _, a in load.failures} <= {None}, load.failure_kinds()


# --- 9. kill -9 of writing workers while another instance streams ------------------------------


def all_feed_ids(url: str) -> list[int]:
    """Every event id of the feed, paged with next_cursor."""
    ids: list[int] = []
    after = 0
    while True:
        body = requests.get(f"{url}/api/events", params={"after": after, "limit": 1000}, timeout=30).json()
        ids += [event["id"] for event in body["events"]]
        if not body["events"]:
            return ids
        after = body["next_cursor"]


def test_kill_9_of_writing_workers_loses_no_event_on_another_instances_streams(postgres):
    # Writers announce their events after they commit (collector/fanout.py): a worker killed
    # between a commit and its announcement must cost the streams latency, never an event.
    postgres.clean()
    streamer = gunicorn(postgres.url, workers=1)
    writer = gunicorn(postgres.url, workers=2)
    streams = []
    try:
        streams = [sse.connect(streamer.url, "/api/events/stream", params={"after": 0}) for _ in range(2)]
        master = writer.proc.pid
        wait_for(lambda: len(workers_of(master)) == 2, 20, "two workers")
        load = Load(writer.url, prefix="announce-", threads=6).start()
        for _ in range(3):
            time.sleep(1.0)
            os.kill(random.choice(workers_of(master)), signal.SIGKILL)
            wait_for(lambda: len(workers_of(master)) == 2, 20, "a replacement worker")
        time.sleep(1.0)
        load.stop()
        report = verify(postgres.engine, load.writes, url=writer.url)
        expected = all_feed_ids(writer.url)
        # A lost announcement waits for the streamer's 15 s listener check at most.
        received = [[int(frame.id or 0) for frame in stream.events(len(expected), timeout=30)] for stream in streams]
    finally:
        for stream in streams:
            stream.close()
        writer.stop()
        streamer.stop()
    figure(f"kill -9 of writing workers, another instance streaming: {len(expected)} events; {load.summary()}")
    assert_stored(report, load)
    assert len(expected) >= len([w for w in load.acked if w.changes_job]) > 0
    for ids in received:
        assert ids == expected  # every event once, in feed order


# --- 10. webhook deliveries across kill -9 of workers ---------------------------------------------


def events_of(database, prefix: str) -> list[int]:
    """The ids of every stored event of the jobs whose id starts with ``prefix``, in feed order."""
    with database.engine.connect() as conn:
        return list(conn.execute(text(
            "SELECT e.id FROM job_events e JOIN jobs j ON j.id = e.job_pk WHERE j.job_id LIKE :p ORDER BY e.id"),
            {"p": prefix + "%"}).scalars())


def delivered(receiver) -> list[int]:
    """The event id of every delivery the receiver got, in arrival order."""
    return [json.loads(request.body)["event"]["id"] for request in receiver.of("POST")]


def test_webhook_deliveries_come_once_while_healthy_and_none_is_lost_to_kill_9(database, recorder):
    database.clean()
    receiver = recorder(script=lambda request, recorder: (200, {}, b"ok"))
    server = gunicorn(database.url, workers=2, COLLECTOR_WEBHOOK_POLL_INTERVAL="0.1")
    try:
        master = server.proc.pid
        wait_for(lambda: len(workers_of(master)) == 2, 20, "two workers")
        every_status = ["submitted", "starting", "workers", "frontend", "benchmark", "completed", "failed", "timeout"]
        assert requests.post(f"{server.url}/api/webhooks", json={"url": receiver.url, "statuses": every_status},
                             timeout=10).status_code == 201
        # Healthy: both workers deliver, each event exactly once, in feed order.
        calm = Load(server.url, prefix="hook-calm-", threads=4, jobs=12).start().wait(60)
        healthy = events_of(database, "hook-calm-")
        wait_for(lambda: len(delivered(receiver)) >= len(healthy), 30, "every healthy delivery")
        time.sleep(0.5)
        assert delivered(receiver) == healthy
        # Workers killed mid-load: every event still arrives, in order of first arrival.
        load = Load(server.url, prefix="hook-kill-", threads=4).start()
        kills = 0
        for _ in range(2):
            time.sleep(1.5)
            kill_a_worker(server, master)
            kills += 1
        time.sleep(1.0)
        load.stop()
        report = verify(database.engine, load.writes, url=server.url)
        expected = healthy + events_of(database, "hook-kill-")
        started = time.monotonic()
        # A delivery a killed worker held waits out its lease (30 s) before another sends it.
        wait_for(lambda: set(delivered(receiver)) >= set(expected), 120, "every delivery after the kills")
        caught_up = time.monotonic() - started
    finally:
        server.stop()
    arrivals = delivered(receiver)
    first_arrivals = list(dict.fromkeys(arrivals))
    repeats = len(arrivals) - len(first_arrivals)
    figure(f"webhooks, kill -9 of workers ({database.url.split(':')[0]}): {kills} kills, {len(expected)} events "
           f"delivered, {repeats} sent twice, caught up {caught_up:.1f} s after the load; {calm.summary()}; "
           f"{load.summary()}")
    assert_stored(report, load)
    assert first_arrivals == expected  # each once at least, in feed order
    # Only what a killed worker was sending can go twice: the subscription's one run in
    # flight (its answers are written down when the run ends), so at most a run per kill.
    assert repeats <= kills * deliveries.RUN


def test_deliveries_pending_at_a_kill_9_of_the_whole_server_go_after_the_restart_without_a_request(
        database, recorder):
    database.clean()
    refusing = threading.Event()
    refusing.set()
    receiver = recorder(script=lambda request, recorder: (503, {}, b"down") if refusing.is_set() else
                        (200, {}, b"ok"))
    server = gunicorn(database.url, workers=2, COLLECTOR_WEBHOOK_POLL_INTERVAL="0.1")
    try:
        assert requests.post(f"{server.url}/api/webhooks", json={"url": receiver.url, "statuses": ["submitted"]},
                             timeout=10).status_code == 201
        load = Load(server.url, prefix="hook-restart-", threads=2, jobs=6).start().wait(60)
        expected = [event for event in events_of(database, "hook-restart-")
                    if database.scalar("SELECT status FROM job_events WHERE id = :i", i=event) == "submitted"]
        assert len(expected) == 6
        wait_for(lambda: database.scalar("SELECT count(*) FROM webhook_deliveries") == 6, 10, "six deliveries")
        wait_for(lambda: database.scalar("SELECT count(*) FROM webhook_deliveries WHERE attempts > 0"), 10,
                 "a refused delivery")
        os.killpg(server.proc.pid, signal.SIGKILL)  # master and workers, mid-retry
        server.proc.wait(timeout=10)
        server.stop()
        assert database.scalar("SELECT count(*) FROM webhook_deliveries WHERE state = 'pending'") == 6
        refusing.clear()
        server = gunicorn(database.url, workers=2, COLLECTOR_WEBHOOK_POLL_INTERVAL="0.1")
        restarted = time.monotonic()
        # No request reaches the new server: its workers start delivering on their own.
        wait_for(lambda: set(delivered(receiver)) >= set(expected), 60, "every delivery after the restart")
        caught_up = time.monotonic() - restarted
        # Written down a moment after the receiver answered (a run's answers go together).
        wait_for(lambda: database.scalar("SELECT count(*) FROM webhook_deliveries WHERE state = 'sent'") == 6, 10,
                 "six deliveries recorded as sent")
    finally:
        server.stop()
    accepted = [json.loads(r.body)["event"]["id"] for r in receiver.of("POST") if r.answer == (200, b"ok")]
    figure(f"webhooks, kill -9 of the server with 6 deliveries pending ({database.url.split(':')[0]}): all "
           f"delivered {caught_up:.1f} s after the restart; {load.summary()}")
    assert accepted == expected  # each taken once, in feed order
    assert database.scalar("SELECT count(*) FROM webhook_deliveries WHERE state = 'sent'") == 6


# --- 11. webhook deliveries across terminated backends ---------------------------------------------


def test_webhook_deliveries_survive_their_database_connections_being_terminated(postgres, recorder):
    # Every connection of the workers, the delivery loops' included, is terminated again
    # and again while events are made and delivered: a turn whose connection dies keeps the
    # answers it had not written down and writes them at its next turn, and a claim whose
    # result never came back is sent once its lease ends. Nothing is lost, nothing repeated.
    postgres.clean()
    receiver = recorder(script=lambda request, recorder: (204, {}, b""))
    server = gunicorn(postgres.url, workers=2, COLLECTOR_WEBHOOK_POLL_INTERVAL="0.1")
    try:
        every_status = ["submitted", "starting", "workers", "frontend", "benchmark", "completed", "failed", "timeout"]
        assert requests.post(f"{server.url}/api/webhooks", json={"url": receiver.url, "statuses": every_status},
                             timeout=10).status_code == 201
        load = Load(server.url, prefix="hook-term-", threads=4).start()
        terminated = terminate_rounds(postgres)
        time.sleep(0.5)
        load.stop()
        report = verify(postgres.engine, load.writes, url=server.url)
        expected = events_of(postgres, "hook-term-")
        started = time.monotonic()
        # A claim lost with its connection waits out its lease (30 s) before it is sent.
        wait_for(lambda: set(delivered(receiver)) >= set(expected), 120, "every delivery after the terminations")
        caught_up = time.monotonic() - started
        wait_for(lambda: postgres.scalar("SELECT count(*) FROM webhook_deliveries WHERE state = 'sent'")
                 == len(expected), 10, "every delivery recorded as sent")
    finally:
        server.stop()
    arrivals = delivered(receiver)
    figure(f"webhooks, backends terminated: {sum(terminated)} backends in 8 rounds {terminated}, {len(expected)} "
           f"events delivered, {len(arrivals) - len(set(arrivals))} sent twice, caught up {caught_up:.1f} s after "
           f"the load; {load.summary()}")
    assert min(terminated) >= 1
    assert_stored(report, load)
    assert arrivals == expected  # each exactly once, in feed order
