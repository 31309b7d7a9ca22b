"""Rotating credentials under load: the tokens file changed while `collector serve` (gunicorn, two workers) serves.

Each worker keeps its own keyring (collector/credentials.py), so every change here must be
noticed by several processes: a new token works at its first use in each of them, a removed
one is refused within a second, SIGHUP's new workers read the file anew, and a broken edit
locks nobody out: a worker started while the file is broken serves on, with the spec's
tokens only, and the shipped gunicorn setup refuses to start on such a file.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import requests

from collector import credentials
from collector.credentials import Keyring
from tests.helpers import wait_for
from tests.processes import ROOT
from tests.processes import ServerProcess
from tests.processes import child_env
from tests.processes import collector_command
from tests.processes import run
from tests.processes import workers_of


class Clients:
    """Threads sending PUTs and GETs without pause, each on a fresh connection, with the current token."""

    def __init__(self, url: str, token: str, names: dict[str, str], threads: int = 6) -> None:
        self.url = url
        self.token = token
        self.names = names  # secret -> credential name, for the answers
        self.answers: list[tuple[str, str, int | None]] = []  # (credential, method, status or None)
        self._moved: set[str] = set()  # threads whose request with the current token has ended
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, name=f"client-{n}", daemon=True) for n in range(threads)]

    def start(self) -> Clients:
        for thread in self._threads:
            thread.start()
        return self

    def switch(self, token: str) -> None:
        """Send ``token`` from now on; requests already sent finish with the old one."""
        with self._lock:
            self.token = token
            self._moved = set()

    def moved(self) -> bool:
        """Whether every thread has finished a request with the current token (so none is left with the old)."""
        with self._lock:
            return len(self._moved) == len(self._threads)

    def answered(self, name: str, status: int | None = 200) -> int:
        with self._lock:
            return sum(1 for who, _, got in self.answers if who == name and got == status)

    def statuses(self) -> Counter[tuple[str, int | None]]:
        with self._lock:
            return Counter((who, got) for who, _, got in self.answers)

    def stop(self) -> Clients:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=15)
        assert not any(t.is_alive() for t in self._threads), "client threads did not stop"
        return self

    def _run(self) -> None:
        me = threading.current_thread().name
        n = 0
        while not self._stop.is_set():
            n += 1
            token = self.token
            job = f"rot-{me}-{(n + 1) // 2 % 10}"  # each GET reads the job the PUT before it wrote
            method = "PUT" if n % 2 else "GET"
            body = {"status": "workers", "stage": "workers", "message": f"update {n}",
                    "updated_at": dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z")}
            try:
                response = requests.request(method, f"{self.url}/api/jobs/{job}",
                                            json=body if method == "PUT" else None,
                                            headers={"Authorization": f"Bearer {token}"}, timeout=5)
                status: int | None = response.status_code
            except requests.RequestException:
                status = None
            with self._lock:
                self.answers.append((self.names[token], method, status))
                if token == self.token:
                    self._moved.add(me)


def status_with(url: str, token: str) -> int:
    return requests.get(url + "/api/jobs", headers={"Authorization": f"Bearer {token}"}, timeout=5).status_code


def log_entries(server: ServerProcess) -> list[dict]:
    # A line cut off mid-write (the server still runs) is left for the next read.
    return [json.loads(line) for line in server.lines if line.endswith("\n")]


@pytest.fixture
def tokens_path(tmp_path) -> Path:
    return tmp_path / "tokens.json"


@pytest.fixture
def start(database, tokens_path):
    """Factory: `collector serve --workers 2 --tokens-file` on the session database, logging JSON."""
    database.clean()
    servers: list[ServerProcess] = []

    def started() -> ServerProcess:
        env = child_env(COLLECTOR_DATABASE_URL=database.url, COLLECTOR_LOG_FORMAT="json")
        servers.append(ServerProcess(collector_command("serve", "--port", "0", "--workers", "2", "--tokens-file",
                                                       str(tokens_path)), env))
        server = servers[-1]
        wait_for(lambda: len(workers_of(server.proc.pid)) == 2, 20, "two workers")
        # A worker reads the file when it starts (post_worker_init), which may be after its
        # sibling's first answers: a test that edits the file before then would find a worker
        # that never read a good file (its own case: test_a_worker_started_while_the_file_is_broken_serves_on).
        wait_for(lambda: len({e["pid"] for e in log_entries(server) if "reloaded:" in e["message"]}) == 2, 20,
                 "both workers to read the tokens file")
        return server

    yield started
    for server in servers:
        server.stop()


def token_cli(*args: str) -> str:
    """`collector token ARGS` as an operator runs it; its stdout."""
    result = run(collector_command("token", *args), child_env())
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_rotation_under_load_answers_no_401(start, tokens_path):
    old = credentials.add(tokens_path, "reporter-old", "write")
    server = start()
    names = {old: "reporter-old"}
    clients = Clients(server.url, old, names).start()
    try:
        wait_for(lambda: clients.answered("reporter-old") >= 30, 15, "answers with the old token")
        new = token_cli("add", "reporter-new", "--role", "write", "--file", str(tokens_path)).splitlines()[-1]
        names[new] = "reporter-new"
        clients.switch(new)  # at once: the first requests with it are each worker's first sight of it
        wait_for(clients.moved, 10, "every client to use the new token")
        token_cli("remove", "reporter-old", "--file", str(tokens_path))
        removed = time.monotonic()
        # Refused everywhere: several refusals in a row, on fresh connections to either worker.
        wait_for(lambda: all(status_with(server.url, old) == 401 for _ in range(8)), 5, "the old token refused")
        refused_after = time.monotonic() - removed
        answered = clients.answered("reporter-new")
        wait_for(lambda: clients.answered("reporter-new") >= answered + 30, 10, "answers after the removal")
    finally:
        clients.stop()
    statuses = clients.statuses()
    assert set(statuses) == {("reporter-old", 200), ("reporter-new", 200)}, statuses
    assert refused_after < 5
    # Both workers took the new token (each had to find it in the file itself).
    entries = log_entries(server)
    assert len({e["pid"] for e in entries if e.get("credential") == "reporter-new"}) == 2
    assert old not in server.output and new not in server.output


def test_sighup_starts_workers_that_read_the_file_anew(start, tokens_path):
    old = credentials.add(tokens_path, "old", "write")
    new = credentials.add(tokens_path, "new", "write")
    server = start()
    master = server.proc.pid
    before = set(workers_of(master))
    clients = Clients(server.url, new, {old: "old", new: "new"}).start()
    try:
        assert status_with(server.url, old) == 200
        wait_for(lambda: clients.answered("new") >= 20, 15, "answers before the reload")
        credentials.remove(tokens_path, "old")
        os.kill(master, signal.SIGHUP)
        # gunicorn starts new workers and stops the old ones gracefully.
        wait_for(lambda: (len(workers_of(master)) == 2 and not set(workers_of(master)) & before), 20,
                 "two new workers and none of the old")
        # The first request after the reload: no second of grace for the removed token.
        assert status_with(server.url, old) == 401
        assert status_with(server.url, new) == 200
        answered = clients.answered("new")
        wait_for(lambda: clients.answered("new") >= answered + 20, 10, "answers after the reload")
        metrics = requests.get(server.url + "/metrics", headers={"Authorization": f"Bearer {new}"}, timeout=5)
        assert metrics.status_code == 200 and "collector_" in metrics.text
    finally:
        clients.stop()
    assert server.proc.poll() is None  # the master lives on
    # Not one client request failed across the reload: gunicorn kept the socket, old workers finished theirs.
    assert set(clients.statuses()) == {("new", 200)}, clients.statuses()
    assert server.output.count("collector listening on") == 1


def test_a_broken_edit_keeps_the_credentials_and_a_fix_applies(start, tokens_path):
    secret = credentials.add(tokens_path, "reporter", "write")
    server = start()
    clients = Clients(server.url, secret, {secret: "reporter"}).start()
    try:
        wait_for(lambda: clients.answered("reporter") >= 20, 15, "answers before the edit")
        good = json.loads(tokens_path.read_text())
        tokens_path.write_text('{"version": 1, "tokens": [')  # in place, as an editor saving a typo

        def complaints() -> set[int]:
            return {e["pid"] for e in log_entries(server) if e["level"] == "ERROR"
                    and e["logger"] == "collector.credentials" and "still using the credentials read before"
                    in e["message"]}

        wait_for(lambda: len(complaints()) == 2, 10, "both workers to report the broken file")
        [line] = {e["message"] for e in log_entries(server) if e["logger"] == "collector.credentials"
                  and "Invalid JSON" in e["message"]}
        assert line.startswith(f"tokens file {tokens_path} is not valid")
        answered = clients.answered("reporter")
        wait_for(lambda: clients.answered("reporter") >= answered + 20, 10, "answers while the file is broken")

        # The fix adds a credential: known at its first use, in whichever worker gets it.
        added = credentials.new_secret()
        good["tokens"].append({"name": "added", "role": "read", "clusters": [], "sha256": credentials.digest(added),
                               "created_at": "2026-12-04T12:00:00Z"})
        tokens_path.write_text(json.dumps(good))
        assert all(status_with(server.url, added) == 200 for _ in range(6))
        wait_for(lambda: len({e["pid"] for e in log_entries(server)
                              if "reloaded: 2 credentials" in e["message"]}) == 2, 10, "both workers to reload")
    finally:
        clients.stop()
    assert set(clients.statuses()) == {("reporter", 200)}, clients.statuses()


def test_a_new_token_is_known_while_another_thread_rereads_the_file(tokens_path, monkeypatch):
    # Two first uses at once, or one during the periodic look: the second thread must wait
    # for the read in progress, not answer from what was known before it (a 401).
    old = credentials.add(tokens_path, "old", "write")
    ring = Keyring(tokens_path, {}, check_every_s=0.0)
    assert ring.lookup(old) is not None
    new = credentials.add(tokens_path, "new", "write")
    reading, release = threading.Event(), threading.Event()
    read_file = credentials.read_file

    def slow_read(path: Path):
        if threading.current_thread().name == "periodic":
            reading.set()
            assert release.wait(10)
        return read_file(path)

    monkeypatch.setattr(credentials, "read_file", slow_read)
    periodic = threading.Thread(target=ring.refresh, name="periodic")
    periodic.start()
    assert reading.wait(10)
    found: list[credentials.Credential | None] = []
    first_use = threading.Thread(target=lambda: found.append(ring.lookup(new)))
    first_use.start()
    first_use.join(timeout=0.5)  # it returns only once the read it waits for is done, or (the bug) at once
    release.set()
    first_use.join(timeout=10)
    periodic.join(timeout=10)
    assert found == [credentials.Credential("new", "write")]


GUNICORN_DEPLOY = [sys.executable, "-m", "gunicorn", "-c", str(ROOT / "deploy" / "gunicorn.conf.py"),
                   "collector.wsgi:app"]


def deploy_env(database, tokens_path: Path, **extra: str) -> dict[str, str]:
    """The shipped gunicorn setup's environment: two workers, a tokens file and the spec's write token."""
    return child_env(COLLECTOR_DATABASE_URL=database.url, COLLECTOR_PORT="0", COLLECTOR_WORKERS="2",
                     COLLECTOR_TOKENS_FILE=str(tokens_path), SRTCTL_STATUS_TOKEN="spec-write", **extra)


def test_gunicorn_refuses_to_start_on_a_broken_tokens_file(database, tokens_path):
    tokens_path.write_text('{"version": 1, "tokens": [')
    tokens_path.chmod(0o600)
    result = run(GUNICORN_DEPLOY, deploy_env(database, tokens_path), timeout=60)
    assert result.returncode == 1
    assert f"Error: tokens file {tokens_path} is not valid: the file: Invalid JSON" in result.stderr


def test_a_worker_started_while_the_file_is_broken_serves_on(database, tokens_path):
    # A worker killed (or recycled) while the file is broken must not take the master down
    # with it: its replacement serves, knowing the spec's tokens only, until the file is fixed.
    database.clean()
    secret = credentials.add(tokens_path, "reporter", "write")
    server = ServerProcess(GUNICORN_DEPLOY, deploy_env(database, tokens_path, COLLECTOR_LOG_FORMAT="json"))
    try:
        master = server.proc.pid
        wait_for(lambda: len(workers_of(master)) == 2, 20, "two workers")
        assert all(status_with(server.url, secret) == 200 for _ in range(8))
        good = tokens_path.read_text()
        tokens_path.write_text('{"version": 1, "tokens": [')
        victim = min(workers_of(master))
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: len(workers_of(master)) == 2 and victim not in workers_of(master), 20, "a new worker")
        # Found by what only a worker that never read a good file says, not by a set of pids
        # (the master's children at one instant may include one that is about to go).
        new_worker = wait_for(lambda: next((e["pid"] for e in log_entries(server) if e["level"] == "ERROR"
                                            and e["message"].endswith("knows only the spec's tokens")), None),
                              10, "the new worker to report the broken file")
        assert new_worker in workers_of(master) and new_worker != victim
        answers = Counter(status_with(server.url, secret) for _ in range(20))
        assert set(answers) <= {200, 401}, (answers, server.output[-5000:])
        assert all(status_with(server.url, "spec-write") == 200 for _ in range(8))
        assert server.proc.poll() is None
        tokens_path.write_text(good)
        wait_for(lambda: all(status_with(server.url, secret) == 200 for _ in range(8)), 5, "the fixed file applied")
    finally:
        server.stop()
    complaints = [e["message"] for e in log_entries(server) if e["pid"] == new_worker and e["level"] == "ERROR"]
    assert len(complaints) == 1, server.output[-5000:]
    [complaint] = complaints
    assert complaint == (f"tokens file {tokens_path} is not valid: the file: Invalid JSON: EOF while parsing a list "
                         "at line 1 column 26; until it is fixed this process knows only the spec's tokens")
