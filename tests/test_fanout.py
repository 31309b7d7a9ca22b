"""Fan-out across processes (PostgreSQL): gunicorn instances on one database, listeners killed, SIGTERM."""

from __future__ import annotations

import functools
import signal
import sys
import time

import pytest
import requests
from sqlalchemy import text

from tests import sse
from tests.helpers import wait_for
from tests.processes import ServerProcess
from tests.processes import child_env

TOKEN = "w-fanout"
LISTENERS = "FROM pg_stat_activity WHERE application_name = 'collector-listener' AND backend_start >= :since"


def gunicorn(database, **extra) -> ServerProcess:
    """deploy/gunicorn.conf.py with two workers on the session database."""
    env = dict(COLLECTOR_DATABASE_URL=database.url, COLLECTOR_PORT="0", COLLECTOR_WORKERS="2",
               COLLECTOR_THREADS="4", COLLECTOR_MAX_STREAMS="8", COLLECTOR_STREAM_HEARTBEAT="0.5",
               SRTCTL_STATUS_TOKEN=TOKEN)
    return ServerProcess([sys.executable, "-m", "gunicorn", "-c", "deploy/gunicorn.conf.py", "collector.wsgi:app"],
                         child_env(**{**env, **extra}))


@pytest.fixture
def since(postgres):
    """The database's clock now: listener connections that start later are this test's."""
    return postgres.scalar("SELECT clock_timestamp()")


@pytest.fixture
def pair(postgres, since):
    """Two gunicorn instances, A and B, sharing the session database."""
    postgres.clean()
    servers = [gunicorn(postgres), gunicorn(postgres)]
    yield servers
    for server in servers:
        assert server.stop() == 0, server.output


@pytest.fixture
def listen():
    """Factory: a stream on a gunicorn instance; all are closed at the end."""
    opened = []

    def open_stream(server, **params):
        stream = sse.connect(server.url, "/api/events/stream", token=TOKEN, params=params)
        assert stream.status == 200, stream.body()
        opened.append(stream)
        return stream

    yield open_stream
    for stream in opened:
        stream.close()


def put(server, job_id, message):
    body = {"status": "workers", "message": message, "updated_at": "2025-01-26T10:35:00Z"}
    response = requests.put(f"{server.url}/api/jobs/{job_id}", json=body,
                            headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    assert response.status_code == 200, response.text


def feed_ids(server, after=0) -> list[int]:
    response = requests.get(f"{server.url}/api/events", params={"after": after, "limit": 1000},
                            headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    return [event["id"] for event in response.json()["events"]]


def listener_pids(database, since) -> set[int]:
    with database.engine.connect() as conn:
        return {pid for (pid,) in conn.execute(text(f"SELECT pid {LISTENERS}"), {"since": since})}


def replaced(database, since, old: set[int]) -> set[int] | None:
    """The listener pids once there are at least as many as ``old`` and none of them is an old one.

    At least: a worker's hub also starts with its first write (to announce it), so a
    worker that only wrote after the kill adds a listener.
    """
    now = listener_pids(database, since)
    return now if len(now) >= len(old) and now.isdisjoint(old) else None


def ids(frames) -> list[int]:
    return [int(frame.id) for frame in frames]


def test_a_write_through_one_instance_streams_from_the_other(pair, listen):
    a, b = pair
    on_a, on_b = listen(a), listen(b)
    put(a, "via-a", "hello")
    (frame,) = on_b.events(1, timeout=5)  # B's worker never saw the PUT: only its listener told it
    assert (frame.json()["job_id"], frame.json()["message"]) == ("via-a", "hello")
    assert ids(on_a.events(1, timeout=5)) == ids([frame])
    put(b, "via-b", "back")
    assert [f.json()["job_id"] for f in on_a.events(1, timeout=5)] == ["via-b"]
    assert [f.json()["job_id"] for f in on_b.events(1, timeout=5)] == ["via-b"]


def test_killed_listeners_lose_and_repeat_nothing(pair, listen, postgres, since):
    a, b = pair
    # Several streams per instance, so both workers of each are likely to hold one.
    streams = [listen(server, after=0) for server in (a, b) for _ in range(3)]
    put(a, "warm", "up")
    firsts = [stream.events(1) for stream in streams]
    listeners = listener_pids(postgres, since)
    assert len(listeners) >= 2  # one per worker that serves a stream, so at least one per instance
    for round_ in range(3):
        killed = postgres.scalar(f"SELECT count(pg_terminate_backend(pid)) {LISTENERS}", since=since)
        assert killed >= len(listeners)  # a hub started by a write since may add one
        for i in range(6):  # written while the listeners are down or reconnecting
            put((a, b)[i % 2], f"job-{i % 3}", f"round {round_} write {i}")
        # Every hub connects again: at least as many listeners as before, none of them an old one.
        listeners = wait_for(functools.partial(replaced, postgres, since, listeners), what="new listener connections")
    put(b, "warm", "done")
    expected = feed_ids(a)
    assert len(expected) == 1 + 3 * 6 + 1
    for first, stream in zip(firsts, streams, strict=True):
        assert ids(first + stream.events(len(expected) - 1)) == expected  # each once, in id order
    for server in (a, b):
        assert "event feed reader failed" in server.output
        assert "event listener reconnected" in server.output


def test_sigterm_ends_open_streams_promptly(postgres, listen):
    server = gunicorn(postgres, COLLECTOR_GRACEFUL_TIMEOUT="30")
    try:
        streams = [listen(server) for _ in range(3)]
        for stream in streams:
            stream.next(timeout=5)  # a heartbeat: the stream is open and idle
        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)  # gunicorn's graceful stop
        for stream in streams:
            stream.until_end(timeout=10)
            assert stream.complete
            assert stream.comments[-1] == "server shutting down; reconnect with Last-Event-ID"
        assert server.proc.wait(timeout=15) == 0
        # Well inside the 30 s graceful timeout that open streams would otherwise use up.
        assert time.monotonic() - started < 10
    finally:
        server.stop()
