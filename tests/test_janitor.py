"""One sweeper: of every process on a database, one at a time runs the stale-job sweep, and another takes over."""

from __future__ import annotations

import datetime as dt
import logging
import os
import re
import signal
import sys
import threading
import time
import uuid

import pytest
import requests
from flask import Flask
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

from collector import per_process
from collector.app import create_app
from collector.janitor import get_janitor
from collector.settings import Settings
from collector.store.identity import FEED_LOCK
from collector.store.identity import JOB_LOCK
from collector.sweeper import APPLICATION_NAME
from collector.sweeper import SWEEPER_LOCK
from collector.sweeper import lock_path
from tests.helpers import stop_app
from tests.helpers import wait_for
from tests.processes import ServerProcess
from tests.processes import child_env

GUNICORN = [sys.executable, "-m", "gunicorn", "-c", "deploy/gunicorn.conf.py", "collector.wsgi:app"]
GAUGE = "collector_stale_sweeper_leader"
INTERVAL = 1.0
# Time a takeover may take past one interval on a loaded 2-core machine (a scrape, a connect).
SLACK = 2.0
_BOOTED = re.compile(r"Booting worker with pid: (\d+)")
_BECAME = re.compile(r"\[(\d+)\] INFO collector\.stale: this process \(pid \d+\) is now the stale-job sweeper")


# -- in one process: two janitors on one database -------------------------------------


@pytest.fixture
def janitors(database):
    """Factory: the janitor of a fresh app on the session database; all stopped at the end."""
    database.clean()
    apps = []

    def make(**overrides):
        app = create_app(Settings(database_url=database.url, **overrides))
        apps.append(app)
        return get_janitor(app)

    yield make
    for app in apps:
        get_janitor(app).hub.close()
        get_janitor(app).resign("the test ended")
        stop_app(app)


def counting_sweeps(janitor) -> list:
    """Record each sweep ``janitor``'s thread runs (the instance attribute hides the method)."""
    sweeps = []
    real = janitor.sweep

    def sweep(now=None):
        sweeps.append(time.monotonic())
        return real(now)

    janitor.sweep = sweep
    return sweeps


def test_the_sweeper_lock_has_a_namespace_of_its_own():
    assert SWEEPER_LOCK not in (JOB_LOCK, FEED_LOCK)


def test_two_janitors_on_one_database_take_turns(janitors):
    first, second = janitors(), janitors()
    assert first.lead() is True
    assert second.lead() is False
    assert (first.lead(), second.lead()) == (True, False)  # held, not taken again
    first.resign("a test")
    assert second.lead() is True
    assert first.lead() is False
    assert (first.leading, second.leading) == (False, True)


def test_only_the_leader_sweeps_and_another_takes_over_when_it_stops(janitors, caplog):
    caplog.set_level(logging.INFO, logger="collector.stale")
    first, second = janitors(stale_check_s=0.1), janitors(stale_check_s=0.1)
    sweeps = {first: counting_sweeps(first), second: counting_sweeps(second)}
    first.ensure_running()
    wait_for(lambda: first.leading, what="the first janitor to lead")
    second.ensure_running()
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:  # ten intervals of both threads trying
        assert not (first.leading and second.leading)
        time.sleep(0.01)
    assert len(sweeps[first]) >= 5 and sweeps[second] == []
    # The leader's server shuts down: it gives the role up and the other one sweeps.
    first.hub.close()
    stopped = time.monotonic()
    wait_for(lambda: sweeps[second], timeout=0.1 + SLACK, what="the second janitor to sweep")
    assert sweeps[second][0] - stopped <= 0.1 + SLACK
    assert not first.leading and second.leading
    became = [r.getMessage() for r in caplog.records if "is now the stale-job sweeper" in r.getMessage()]
    left = [r.getMessage() for r in caplog.records if "is no longer the stale-job sweeper" in r.getMessage()]
    assert len(became) == 2 and left == [f"this process (pid {os.getpid()}) is no longer the stale-job sweeper: "
                                         "the server is shutting down"]


def sweeper_backends(postgres) -> list[int]:
    """The backends of this database that hold the sweeper lock."""
    with postgres.engine.connect() as conn:
        return list(conn.execute(text(
            "SELECT l.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' "
            "AND l.classid = :ns AND l.objid = 0 AND l.objsubid = 2 AND l.granted "
            "AND a.application_name = :name AND a.datname = current_database()"),
            {"ns": SWEEPER_LOCK, "name": APPLICATION_NAME}).scalars())


def test_the_sweeper_is_visible_where_it_holds_its_lock(janitors, database):
    janitor = janitors()
    assert janitor.lead()
    if database.is_postgres:
        assert len(sweeper_backends(database)) == 1
    else:
        path = lock_path(janitor.database)
        assert path is not None
        assert path.name == os.path.basename(janitor.database.engine.url.database) + ".sweeper.lock"
        assert path.read_text() == f"{os.getpid()}\n"


def test_a_lost_lock_connection_is_noticed_and_the_role_taken_again(postgres, janitors, caplog):
    caplog.set_level(logging.INFO, logger="collector.stale")
    janitor = janitors(stale_check_s=0.2)
    janitor.ensure_running()
    wait_for(lambda: janitor.leading, what="the janitor to lead")
    (backend,) = sweeper_backends(postgres)
    assert postgres.scalar("SELECT pg_terminate_backend(:pid)", pid=backend)
    wait_for(lambda: sweeper_backends(postgres) not in ([], [backend]), timeout=0.2 + SLACK,
             what="the lock taken again on a new connection")
    assert len(sweeper_backends(postgres)) == 1
    assert janitor.leading
    messages = [r.getMessage() for r in caplog.records]
    assert any("is no longer the stale-job sweeper: its lock was lost" in m for m in messages)
    assert sum("is now the stale-job sweeper" in m for m in messages) == 2


# -- real processes: gunicorn with three workers -----------------------------------------


def start_gunicorn(database, **extra) -> ServerProcess:
    """Three gunicorn workers on the session database, sweeping every INTERVAL seconds."""
    database.clean()
    return ServerProcess(GUNICORN, child_env(
        COLLECTOR_DATABASE_URL=database.url, COLLECTOR_PORT="0", COLLECTOR_WORKERS="3", COLLECTOR_THREADS="4",
        COLLECTOR_MAX_STREAMS="4", COLLECTOR_STALE_CHECK_INTERVAL=str(INTERVAL), **extra))


def booted_workers(server: ServerProcess) -> list[int]:
    """The pids of the three workers, once booted; each starts its janitor at boot, before any request."""
    booted = wait_for(lambda: found if len(set(found := _BOOTED.findall(server.output))) == 3 else None,
                      what="three booted workers")
    return sorted({int(pid) for pid in booted})


def sweepers(server: ServerProcess) -> float:
    """The sweeper gauge of one scrape: how many live workers of this server are the sweeper."""
    body = requests.get(server.url + "/metrics", timeout=5).text
    return sum(sample.value for family in text_string_to_metric_families(body)
               for sample in family.samples if sample.name == GAUGE)


def became(server: ServerProcess) -> list[int]:
    """The pids that logged becoming the sweeper, in order."""
    return [int(pid) for pid in _BECAME.findall(server.output)]


def submit(server: ServerProcess, job_id: str) -> None:
    body = {"job_id": job_id, "job_name": f"n-{job_id}", "cluster": "c1",
            "submitted_at": dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z")}
    assert requests.post(server.url + "/api/jobs", json=body, timeout=5).status_code == 201


def events(server: ServerProcess, job_id: str) -> list[str]:
    response = requests.get(server.url + f"/api/jobs/{job_id}", params={"cluster": "c1"}, timeout=5)
    assert response.status_code == 200, response.text
    return [event["status"] for event in response.json()["events"]]


def test_three_workers_have_one_sweeper_and_a_stale_job_fails_once(database):
    server = start_gunicorn(database, COLLECTOR_STALE_SILENCE="2")
    try:
        workers = booted_workers(server)
        job_id = "one-" + uuid.uuid4().hex[:8]
        submit(server, job_id)
        wait_for(lambda: "failed" in events(server, job_id), timeout=2 + INTERVAL + SLACK,
                 what="the silent job to fail")
        time.sleep(2 * INTERVAL)  # every worker has tried (and swept, if it led) at least twice more
        assert events(server, job_id) == ["submitted", "failed"]
        assert sweepers(server) == 1
        (leader,) = became(server)
        assert leader in workers
        marked = [line for line in server.lines if f"job c1/{job_id} marked failed" in line]
        assert len(marked) == 1
    finally:
        assert server.stop() == 0, server.output


def test_a_killed_sweeper_is_replaced_within_one_interval(database):
    server = start_gunicorn(database, COLLECTOR_STALE_SILENCE="2")
    try:
        booted_workers(server)
        victim = wait_for(lambda: became(server), what="a sweeper")[0]
        assert sweepers(server) == 1
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        successor = wait_for(lambda: became(server)[1:], timeout=INTERVAL + SLACK,
                             what="another worker to take the sweeper role")[0]
        assert time.monotonic() - killed <= INTERVAL + SLACK
        # No request reached the workers since the kill: any live one, the victim's
        # replacement included, competes for the role from its boot.
        assert successor != victim and successor in {int(pid) for pid in _BOOTED.findall(server.output)}
        # Until gunicorn reaps the victim its gauge counts too (2); then one sweeper again, and it sweeps.
        wait_for(lambda: sweepers(server) == 1, what="the dead worker's gauge to go")
        assert became(server) == [victim, successor]
        job_id = "after-" + uuid.uuid4().hex[:8]
        submit(server, job_id)
        wait_for(lambda: "failed" in events(server, job_id), timeout=2 + INTERVAL + SLACK, what="the new sweeper")
        assert events(server, job_id) == ["submitted", "failed"]
    finally:
        assert server.stop() == 0, server.output


def test_join_all_waits_for_each_background_thread_and_names_the_ones_still_running():
    stop, finished = threading.Event(), []

    def work():
        stop.wait()
        time.sleep(0.2)  # its last statement, after it was told to stop
        finished.append(True)

    app = Flask(__name__)
    runner = per_process.PerProcess("collector-test-runner", work)
    idle = per_process.PerProcess("collector-test-never-started", work)
    per_process.keep_running(app, runner)
    per_process.keep_running(app, idle)
    runner.ensure_running()
    assert per_process.join_all(app.extensions, timeout=0.1) == ["collector-test-runner"]
    stop.set()
    assert per_process.join_all(app.extensions, timeout=5) == []
    assert finished == [True]
