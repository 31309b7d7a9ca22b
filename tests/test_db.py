"""Database.run: dead connections are replayed once, on every path, and a replay never writes twice."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from sqlalchemy import Engine
from sqlalchemy import event
from sqlalchemy import make_url
from sqlalchemy import text

from collector.db import Database
from collector.settings import Settings
from collector.store import counts
from collector.store.identity import JOB_LOCK

OCTET = {"Content-Type": "application/octet-stream"}
LIFECYCLE = ("starting", "workers", "frontend", "benchmark", "completed")
KILL_APP_BACKENDS = ("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                     " WHERE datname = current_database() AND pid <> pg_backend_pid()")


def driver_url(database) -> str:
    """The test database as a libpq URL."""
    return make_url(database.url).set(drivername="postgresql").render_as_string(hide_password=False)


def stamp(minute: int) -> str:
    return f"2025-01-26T10:{minute:02d}:00Z"


def submit_body(job_id: str, cluster: str = "c1") -> dict:
    return {"job_id": job_id, "job_name": f"n-{job_id}", "submitted_at": stamp(0), "cluster": cluster}


def upload_log(api, job_id, file, offset, data):
    return api.post(f"/api/jobs/{job_id}/logs", params={"file": file, "offset": offset}, data=data,
                    headers=dict(OCTET))


def detail(api, job_id) -> dict:
    response = api.get(f"/api/jobs/{job_id}")
    assert response.status_code == 200, response.text
    return response.json()


def log_text(api, job_id, file) -> str:
    response = api.get(f"/api/jobs/{job_id}/logs", params={"file": file})
    assert response.status_code == 200, response.text
    return response.json()["data"]


def timeline(job: dict) -> list[str]:
    return [event["status"] for event in job["events"]]


class Killer:
    """Terminates every backend of the test database but its own, on demand or in a loop."""

    def __init__(self, database) -> None:
        self.conn = psycopg.connect(driver_url(database), autocommit=True)
        self.killed = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def kill(self) -> int:
        row = self.conn.execute(KILL_APP_BACKENDS).fetchone()
        assert row is not None
        count = row[0]
        self.killed += count
        return count

    def _loop(self, low: float, high: float) -> None:
        while not self._stop.wait(random.uniform(low, high)):
            self.kill()

    # Rounds far enough apart that a replay (a reconnect, then the transaction again) is
    # not itself killed: one replay is the contract, and a loaded machine stretches it
    # (a full-suite run saw a replay take 310 ms and meet the next round at 0.25-0.5 s).
    def start(self, low: float = 0.5, high: float = 1.0) -> None:
        self._thread = threading.Thread(target=self._loop, args=(low, high), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)
        self.conn.close()


class Load:
    """Writes one job's whole life (POST, PUTs, log chunks) and records every answer."""

    def __init__(self, api, between=None) -> None:
        self.api = api
        self.between = between or (lambda: None)
        self.answers: list[int] = []
        self.logs: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def _send(self, request) -> None:
        # Like the reporter (and the log streamer), resend until acknowledged, so that
        # every write is eventually stored and a 5xx is counted, not hidden.
        for _ in range(20):
            response = request()
            with self._lock:
                self.answers.append(response.status_code)
            if response.status_code < 500:
                assert response.status_code in (200, 201), response.text
                self.between()
                return
        raise AssertionError("a write was never acknowledged")

    def job(self, job_id: str, chunks: int = 6) -> None:
        api = self.api
        self._send(lambda: api.post("/api/jobs", json=submit_body(job_id)))
        data = b""
        for minute, status in enumerate(LIFECYCLE, start=1):
            body = {"status": status, "updated_at": stamp(minute), "message": f"{status} {job_id}"}
            self._send(lambda body=body: api.put(f"/api/jobs/{job_id}", json=body))
            for n in range(chunks // len(LIFECYCLE) + 1):
                chunk = f"{job_id} {status} line {n}\n".encode()
                at = len(data)
                self._send(lambda chunk=chunk, at=at: upload_log(api, job_id, "run.out", at, chunk))
                data += chunk
        self.logs[job_id] = data

    def server_errors(self) -> int:
        return sum(code >= 500 for code in self.answers)


def assert_every_write_stored(api, database, load: Load) -> None:
    """Each job went through its whole life once, with all its log bytes, and the counts agree."""
    for job_id, data in load.logs.items():
        job = detail(api, job_id)
        assert timeline(job) == ["submitted", *LIFECYCLE], job_id
        assert log_text(api, job_id, "run.out") == data.decode()
    assert database.scalar("SELECT count(*) FROM job_events") == len(load.logs) * (1 + len(LIFECYCLE))
    assert database.count_of("c1", "completed") == len(load.logs)
    database.assert_counts_match_jobs()


def test_writes_replay_when_backends_die_between_requests(postgres, api):
    killer = Killer(postgres)
    # Every write after the first meets the pooled connection its predecessor used, dead.
    load = Load(api, between=killer.kill)
    try:
        for n in range(30):
            load.job(f"b{n}", chunks=0)
    finally:
        killer.stop()
    assert killer.killed >= 30 * (1 + 2 * len(LIFECYCLE))
    assert load.server_errors() == 0
    assert len(load.answers) == 30 * (1 + 2 * len(LIFECYCLE))
    assert_every_write_stored(api, postgres, load)


def test_writes_replay_when_backends_die_under_load(postgres, api):
    load = Load(api)
    killer = Killer(postgres)
    killer.start()
    try:
        with ThreadPoolExecutor(max_workers=6) as pool:
            list(pool.map(load.job, [f"l{n}" for n in range(60)]))
    finally:
        killer.stop()
    # Proof that the fault happened while the writes ran.
    assert killer.killed >= 20
    assert load.server_errors() == 0
    assert_every_write_stored(api, postgres, load)


WAITING_ON_A_LOCK = ("SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                     " AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()")


def waiting_backend(killer: Killer) -> int:
    """The one app backend blocked on a lock the test holds."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pids = [row[0] for row in killer.conn.execute(WAITING_ON_A_LOCK)]
        if pids:
            assert len(pids) == 1, pids
            return pids[0]
        time.sleep(0.005)
    raise AssertionError("no request ever waited on the lock")


def killed_mid_transaction(database, lock_sql: str, params: tuple, request):
    """Send ``request`` while the test holds a lock it needs; terminate its backend as it waits, then let go.

    The backend dies in the middle of the request's transaction, at the statement that
    takes the lock: deterministic, where a kill loop only lands there by chance.
    """
    killer = Killer(database)
    try:
        with psycopg.connect(driver_url(database)) as holder, ThreadPoolExecutor(max_workers=1) as pool:
            holder.execute(lock_sql, params)
            answer = pool.submit(request)
            pid = waiting_backend(killer)
            terminated = killer.conn.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()
            assert terminated is not None and terminated[0]
            holder.commit()
            return answer.result(timeout=20)
    finally:
        killer.stop()


JOB_LOCKED = "SELECT pg_advisory_xact_lock(%s, hashtext(%s))"
ROW_LOCKED = "SELECT id FROM jobs WHERE job_id = %s FOR UPDATE"


@pytest.mark.parametrize("job_id, status, lock_sql, lock_key", [
    ("p1", "workers", JOB_LOCKED, (JOB_LOCK, "p1")),  # the pipelined lock-and-read
    ("p2", "frontend", ROW_LOCKED, ("p2",)),  # the pipelined write-and-commit (its UPDATE waits)
], ids=["pipelined-read", "pipelined-commit"])
def test_a_put_killed_in_a_pipelined_statement_is_replayed(postgres, api, job_id, status, lock_sql, lock_key):
    assert api.post("/api/jobs", json=submit_body(job_id)).status_code == 201
    body = {"status": status, "updated_at": stamp(5)}
    response = killed_mid_transaction(postgres, lock_sql, lock_key,
                                      lambda: api.put(f"/api/jobs/{job_id}", json=body))
    assert (response.status_code, response.json()) == (200, {"job_id": job_id, "status": status, "cluster": "c1"})
    assert timeline(detail(api, job_id)) == ["submitted", status]
    postgres.assert_counts_match_jobs()


def test_a_delete_killed_in_a_sqlalchemy_statement_is_replayed(postgres, api):
    assert api.post("/api/jobs", json=submit_body("p3")).status_code == 201
    response = killed_mid_transaction(postgres, ROW_LOCKED, ("p3",), lambda: api.delete("/api/jobs/p3"))
    assert (response.status_code, response.json()) == (200, {"deleted": True, "job_id": "p3", "cluster": "c1"})
    assert api.get("/api/jobs/p3").status_code == 404
    assert postgres.count_of("c1", "submitted") == 0
    postgres.assert_counts_match_jobs()


# Every table a write can touch, and the columns that hold the collector's clock (when
# a request arrived), not what the request said: those are left out of comparisons.
TABLES = {
    "jobs": "id", "job_events": "id", "blob_files": "id",
    "blob_chunks": "file_id, start_offset", "cluster_probes": "cluster", "slurm_jobs": "job_pk",
}
CLOCK_COLUMNS = {"received_at", "observed_at", "status_since", "state_since", "gone_since"}
BLOB = bytes(range(256)) * 5


def snapshot(database, *, clock_free: bool = False) -> dict[str, list[dict]]:
    """Every row of every table a write touches (``clock_free``: also without times the collector stamped)."""
    skip = CLOCK_COLUMNS | ({"created_at", "updated_at"} if clock_free else set())
    with database.engine.connect() as conn:
        rows = {table: [{k: v for k, v in row._mapping.items() if k not in skip}
                        for row in conn.execute(text(f"SELECT * FROM {table} ORDER BY {order}"))]
                for table, order in TABLES.items()}
        # Event ids on PostgreSQL are transaction ids: their order is what a run decides.
        for row in rows["job_events"]:
            del row["id"]
        # The counts as readers sum them: which stripe a write picked is chance.
        rows["counts"] = [{"cluster": cluster, "status": status, "jobs": jobs}
                          for cluster, statuses in sorted(counts.by_cluster(conn).items())
                          for status, jobs in sorted(statuses.items())]
        return rows


def submitted(api, job_id="w1") -> None:
    assert api.post("/api/jobs", json=submit_body(job_id)).status_code == 201


def probe_report() -> dict:
    return {"probed_at": stamp(30), "nodes": [{"name": "n1", "state": "idle"}],
            "partitions": [{"name": "debug", "state": "up"}],
            "jobs": [{"job_id": "w1", "state": "RUNNING"}], "queried_job_ids": ["w1"]}


def put_body() -> dict:
    return {"status": "starting", "stage": "starting", "message": "Job started on head1", "updated_at": stamp(3),
            "started_at": stamp(3), "metadata": {"cluster": "c1", "head_node": "head1"}}


# route: (setup, the request, its first answer, the answer to the same request again)
WRITES = {
    "POST /api/jobs": (lambda api: None, lambda api: api.post("/api/jobs", json=submit_body("w1")),
                       (201, {"job_id": "w1", "status": "submitted", "cluster": "c1"}),
                       (201, {"job_id": "w1", "status": "submitted", "cluster": "c1"})),
    "PUT /api/jobs/{id}": (submitted, lambda api: api.put("/api/jobs/w1", json=put_body()),
                           (200, {"job_id": "w1", "status": "starting", "cluster": "c1"}),
                           (200, {"job_id": "w1", "status": "starting", "cluster": "c1"})),
    "POST /api/jobs/{id}/logs": (submitted, lambda api: api.post(
        "/api/jobs/w1/logs", params={"file": "run.out", "offset": 0, "final": 1, "cluster": "c1"},
        data=b"line\n", headers=dict(OCTET)), (200, {"job_id": "w1", "stored": 1}),
        # Nothing new to store: the reporter accepts 0 or 1 and moves on either way.
        (200, {"job_id": "w1", "stored": 0})),
    "POST /api/jobs/{id}/captures": (submitted, lambda api: api.post(
        "/api/jobs/w1/captures", params={"file": "out-0.parquet", "offset": 0, "total": len(BLOB)},
        data=BLOB, headers=dict(OCTET)), (200, {"job_id": "w1", "next_offset": len(BLOB), "complete": True}),
        (200, {"job_id": "w1", "next_offset": len(BLOB), "complete": True})),
    "PUT /api/clusters/{cluster}/status": (submitted,
                                           lambda api: api.put("/api/clusters/c1/status", json=probe_report()),
                                           (200, None), (200, None)),
    # The spec's DELETE answers 404 for a job that is not there, also to a repeat.
    "DELETE /api/jobs/{id}": (submitted, lambda api: api.delete("/api/jobs/w1"),
                              (200, {"deleted": True, "job_id": "w1", "cluster": "c1"}),
                              (404, None)),
}


def answer(response) -> tuple[int, dict | None]:
    """Status and body, the body left out where it carries the collector's clock (cluster status)."""
    body = response.json()
    return response.status_code, (None if "probed_at" in body or response.status_code == 404 else body)


# How many events each write adds (the DELETE's job takes its submitted event along).
EVENTS_ADDED = {"POST /api/jobs": 1, "PUT /api/jobs/{id}": 1, "DELETE /api/jobs/{id}": -1}


@pytest.mark.parametrize("route", WRITES)
def test_the_same_write_again_changes_nothing(api, database, route):
    setup, request, first, again = WRITES[route]
    setup(api)
    before = snapshot(database)
    assert answer(request(api)) == first
    once = snapshot(database)
    # Proof that the write did something a repeat could have done twice.
    assert once != before
    assert len(once["job_events"]) == len(before["job_events"]) + EVENTS_ADDED.get(route, 0)
    assert answer(request(api)) == again
    assert snapshot(database) == once
    database.assert_counts_match_jobs()


class LostCommitAnswer:
    """Once armed, lets the next write transaction commit, then kills its backend so SQLAlchemy's COMMIT fails.

    To the collector this is a COMMIT whose answer never came back: the write is stored,
    the connection is dead, and Database.run replays the request's transaction.
    """

    def __init__(self, database) -> None:
        self.database = database
        self.killer = Killer(database)
        self.armed = False
        self.fired = 0

    def __call__(self, conn) -> None:
        if not self.armed or conn.engine is self.database.engine:
            return
        driver = conn.connection.driver_connection
        if driver.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS:
            if driver.execute("SELECT pg_current_xact_id_if_assigned()").fetchone()[0] is None:
                return  # a read: nothing to lose
            driver.commit()
        # (IDLE: the pipelined path has committed already.) Open a transaction for
        # SQLAlchemy's COMMIT to be sent in, and end the session under it.
        self.armed = False
        driver.execute("SELECT 1")
        pid = driver.info.backend_pid
        self.killer.conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        while self.killer.conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone():
            time.sleep(0.002)
        self.fired += 1


@pytest.mark.parametrize("route", WRITES)
def test_a_replay_after_a_lost_commit_answer_writes_once(postgres, api, route):
    setup, request, first, again = WRITES[route]
    setup(api)
    before = snapshot(postgres, clock_free=True)
    assert answer(request(api)) == first
    applied_once = snapshot(postgres, clock_free=True)
    # The same request on the same starting state, but its COMMIT's answer is lost.
    postgres.clean()
    setup(api)
    assert snapshot(postgres, clock_free=True) == before
    lose = LostCommitAnswer(postgres)
    event.listen(Engine, "commit", lose)
    try:
        lose.armed = True
        replayed = answer(request(api))
    finally:
        event.remove(Engine, "commit", lose)
        lose.killer.stop()
    assert lose.fired == 1
    # The replay ran on top of the committed write: it answers as a repeat does and adds nothing.
    assert replayed == again
    assert snapshot(postgres, clock_free=True) == applied_once
    postgres.assert_counts_match_jobs()


def test_the_default_pool_keeps_a_connection_per_request_thread(database):
    """Requests that run at once reuse pooled connections; none is closed and reopened under a steady load.

    A pool smaller than the request threads returns connections past its size by closing
    them, and the next checkout opens a new one: on PostgreSQL a new backend, which cost
    a fifth of a busy worker's throughput (docs/performance.md); on SQLite a new
    connection that sets its pragmas and reads the schema again.
    """
    settings = Settings(database_url=database.url, threads=8)
    assert settings.pool_kept == 10
    db = Database(settings)
    opened = []
    event.listen(db.engine, "connect", lambda dbapi_connection, _record: opened.append(dbapi_connection))
    # Each round, every thread holds a connection at the same moment, then all of them
    # are back in the pool before the next round: the load swings from 0 to 8 at once.
    together = threading.Barrier(settings.request_threads)

    def request(conn) -> None:
        together.wait(timeout=10)
        conn.exec_driver_sql("SELECT 1").scalar_one()

    def requests() -> None:
        for _ in range(20):
            db.run(request)
            together.wait(timeout=10)

    try:
        with ThreadPoolExecutor(settings.request_threads) as pool:
            list(pool.map(lambda _: requests(), range(settings.request_threads)))
    finally:
        db.dispose()
    # Never more connections than requests at once: every one of them was reused.
    assert 1 <= len(opened) <= settings.request_threads


def _minor_faults(pid: int) -> int:
    # /proc/<pid>/stat: the fields after the command's closing parenthesis; minflt is the 8th.
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[7])


def test_log_uploads_reuse_the_backends_heap(postgres, api):
    """A backend keeps the memory of one 256 KiB upload for the next instead of faulting it in again.

    Without collector.db's primer, glibc gave about 1 MiB back to the kernel after each
    upload and the backend took about 100 page faults per upload (docs/performance.md).
    """
    if make_url(postgres.url).host not in (None, "", "localhost", "127.0.0.1", "::1"):
        pytest.skip("the PostgreSQL server is on another machine: its backends' page faults cannot be read here")
    chunk = b"step 1234 loss=0.123 throughput=4567 tok/s\n" * 6000  # 258 KiB of log text

    def upload(i: int) -> None:
        response = api.post("/api/jobs/heap-1/logs", params={"file": "w.out", "offset": i * len(chunk)},
                            data=chunk, headers=dict(OCTET))
        assert response.json() == {"job_id": "heap-1", "stored": 1}

    def backends() -> set[int]:
        with postgres.engine.connect() as conn:
            return set(conn.execute(text(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
                " AND backend_type = 'client backend'")).scalars())

    # One request at a time, so the pool keeps reusing the sessions it has. The first
    # uploads of a session also fault in shared memory it has not touched yet.
    for i in range(40):
        upload(i)
    sessions = backends()  # the uploads' and the app's background threads' (idle meanwhile)
    before = sum(_minor_faults(pid) for pid in sessions)
    for i in range(40, 60):
        upload(i)
    per_upload = (sum(_minor_faults(pid) for pid in sessions) - before) / 20
    assert backends() == sessions  # no upload went to a session opened after the count began
    assert per_upload < 10, f"{per_upload:.1f} page faults per upload"
