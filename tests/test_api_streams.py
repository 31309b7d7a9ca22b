"""/api/events/stream and /api/jobs/{id}/events/stream: frames, cursors, filters, limits and auth."""

from __future__ import annotations

import signal
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from collector import fanout
from collector.settings import Settings
from tests import sse
from tests.helpers import LiveServer
from tests.helpers import wait_for
from tests.processes import ServerProcess
from tests.processes import child_env
from tests.processes import collector_command

STREAM = "/api/events/stream"
OPENING = "retry: 1000\n: collector event stream\n\n"
FAST = {"stream_heartbeat_s": 0.3, "stream_poll_s": 0.1}


def tokens() -> dict:
    return {"write_token": "w-" + uuid.uuid4().hex, "read_token": "r-" + uuid.uuid4().hex}


@pytest.fixture
def server(serve):
    """A shared-deployment collector whose idle streams heartbeat every 0.3 s."""
    return serve(**tokens(), **FAST)


@pytest.fixture
def listen():
    """Factory: open a stream on a server (its write token by default); all are closed at the end."""
    opened = []

    def open_stream(srv, path=STREAM, *, token=True, last_event_id=None, **params):
        headers = {} if last_event_id is None else {"Last-Event-ID": str(last_event_id)}
        stream = sse.connect(srv.url, path, token=srv.token if token is True else token, params=params,
                             headers=headers)
        opened.append(stream)
        return stream

    yield open_stream
    for stream in opened:
        stream.close()


def submit(api, job_id, cluster=None):
    body = {"job_id": job_id, "job_name": f"n-{job_id}", "submitted_at": "2025-01-26T10:30:00Z"}
    response = api.post("/api/jobs", json={**body, **({"cluster": cluster} if cluster else {})})
    assert response.status_code == 201, response.text


def put(api, job_id, status="workers", message=None, cluster=None):
    body = {"status": status, "updated_at": "2025-01-26T10:35:00Z", "message": message}
    if cluster:
        body["metadata"] = {"cluster": cluster}
    response = api.put(f"/api/jobs/{job_id}", json={k: v for k, v in body.items() if v is not None})
    assert response.status_code == 200, response.text


def put_many(api, count, jobs=("j1",), prefix="m"):
    """``count`` events spread over ``jobs``, four writers at a time."""
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: put(api, jobs[i % len(jobs)], message=f"{prefix}{i}"), range(count)))


def feed(api, after=0, **params) -> list[dict]:
    """Every event of GET /api/events after ``after``, page by page."""
    events: list[dict] = []
    while True:
        body = api.get("/api/events", params={"after": after, "limit": 1000, **params}).json()
        if not body["events"]:
            return events
        events += body["events"]
        after = body["next_cursor"]


def ids(frames) -> list[int]:
    return [int(frame.id) for frame in frames]


def keys(frames) -> list[tuple]:
    return [(d["job_id"], d["cluster"], d["status"]) for d in (frame.json() for frame in frames)]


def no_more_events(stream, seconds=0.3) -> bool:
    return all(frame.event == "heartbeat" for frame in stream.quiet_for(seconds))


def open_when_free(listen, server, timeout=10, **cursor):
    """A stream once the server has a slot: one is given back only after its response has ended."""
    deadline = time.monotonic() + timeout
    while (stream := listen(server, **cursor)).status == 503 and time.monotonic() < deadline:
        time.sleep(0.05)
    return stream


def test_events_are_the_feed_with_ids_and_job_summaries(server, listen):
    stream = listen(server)
    assert stream.status == 200
    assert stream.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert stream.headers["cache-control"] == "no-cache, no-transform"
    assert stream.headers["x-accel-buffering"] == "no"
    submit(server, "1", "a")
    put(server, "1", "workers", "up", cluster="a")
    submit(server, "2")
    put(server, "2", "benchmark", "two\nlines, ünïcode")  # still one data: line
    frames = stream.events(4)
    records = feed(server)
    # Exactly these bytes: the opening, then id, event and one data line per event (and
    # heartbeats, if the writes above took longer than the 0.3 s idle time on a busy machine).
    sent = "".join(f"id: {f.id}\nevent: job-event\ndata: {f.data}\n\n" for f in frames)
    assert stream.text.replace("event: heartbeat\ndata: {}\n\n", "") == OPENING + sent
    assert [f.event for f in frames] == ["job-event"] * 4
    assert ids(frames) == [e["id"] for e in records]
    # data is the feed's record plus the job's summary, as GET /api/jobs lists it.
    assert [{k: v for k, v in f.json().items() if k != "job"} for f in frames] == records
    listed = {job["job_id"]: job for job in server.get("/api/jobs").json()["jobs"]}
    assert frames[1].json()["job"] == listed["1"] and frames[3].json()["job"] == listed["2"]
    assert listed["1"]["status"] == "workers" and listed["1"]["cluster"] == "a"
    assert no_more_events(stream)


def test_idle_stream_opens_then_heartbeats(server, listen):
    started = time.monotonic()
    stream = listen(server)
    assert stream.next() == sse.Frame(None, "heartbeat", "{}")
    assert time.monotonic() - started >= 0.3  # only once the stream was idle that long
    assert stream.text == OPENING + "event: heartbeat\ndata: {}\n\n"
    assert stream.retry == 1000 and stream.comments == ["collector event stream"]
    assert stream.last_id is None  # a heartbeat never moves Last-Event-ID
    assert stream.next() == sse.Frame(None, "heartbeat", "{}")


def test_stream_without_cursor_starts_at_the_live_edge(server, listen):
    put(server, "j1", message="before any stream")  # the hub starts with the first stream
    # On PostgreSQL the live edge is the feed horizon, which any transaction still running
    # on the server (another database's included) holds back: an event committed just
    # before a stream opens may still lie past it, and is then the stream's to deliver.
    wait_for(lambda: [e["message"] for e in feed(server)] == ["before any stream"], what="the feed to pass it")
    first = listen(server)
    put(server, "j1", message="a")
    assert [f.json()["message"] for f in first.events(1)] == ["a"]
    # The hub has read "a" (first got it), so a stream opened now starts after it.
    second = listen(server)
    put(server, "j1", message="b")
    assert [f.json()["message"] for f in second.events(1)] == ["b"]
    assert [f.json()["message"] for f in first.events(1)] == ["b"]
    assert no_more_events(second)


@pytest.mark.parametrize("resume", ["header", "after"])
def test_resume_after_a_dropped_connection_misses_and_repeats_nothing(server, listen, resume):
    stream = listen(server)
    put_many(server, 3, prefix="before")
    seen = stream.events(3)
    stream.disconnect()
    put_many(server, 3, prefix="while-away")
    cursor = {"last_event_id": seen[-1].id} if resume == "header" else {"after": seen[-1].id}
    again = listen(server, **cursor)
    put_many(server, 2, prefix="after")
    seen += again.events(5)
    assert ids(seen) == [e["id"] for e in feed(server)]
    assert no_more_events(again)


@pytest.mark.parametrize(
    "after, header, first",
    [(0, None, 0), (1, None, 1), (None, "{2}", 2), (1, "{2}", 2), (2, "{1}", 1), (2, "", 2), (2, " {1} ", 1)],
    ids=["after-0", "after", "header", "header-wins", "older-header-wins", "blank-header", "padded-header"],
)
def test_after_and_last_event_id(server, listen, after, header, first):
    put_many(server, 4)
    known = [e["id"] for e in feed(server)]
    cursors = [0, *known]  # cursors[n]: just past the n-th event
    cursor = {} if after is None else {"after": cursors[after]}
    if header is not None:
        cursor["last_event_id"] = header.format(*cursors)
    stream = listen(server, **cursor)
    assert ids(stream.events(len(known) - first)) == known[first:]
    assert no_more_events(stream)


def seed(api):
    """Two jobs named 1 (clusters a and b) and one named 2 (cluster b), as in test_api_events."""
    submit(api, "1", "a")
    submit(api, "2", "b")
    put(api, "1", "workers", cluster="a")
    submit(api, "1", "b")
    put(api, "2", "workers", cluster="b")
    put(api, "1", "frontend", cluster="b")


def seed_more(api):
    put(api, "1", "benchmark", cluster="a")
    put(api, "2", "frontend", cluster="b")
    put(api, "1", "workers", "again", cluster="b")


B_SUB, B_WORK, B_FRONT = ("2", "b", "submitted"), ("2", "b", "workers"), ("2", "b", "frontend")


@pytest.mark.parametrize(
    "params, replayed, live",
    [({"cluster": "b"}, [B_SUB, ("1", "b", "submitted"), B_WORK, ("1", "b", "frontend")],
      [B_FRONT, ("1", "b", "workers")]),
     ({"job_id": "1"}, [("1", "a", "submitted"), ("1", "a", "workers"), ("1", "b", "submitted"),
                        ("1", "b", "frontend")], [("1", "a", "benchmark"), ("1", "b", "workers")]),
     ({"job_id": "1", "cluster": "a"}, [("1", "a", "submitted"), ("1", "a", "workers")], [("1", "a", "benchmark")]),
     ({"status": "workers"}, [("1", "a", "workers"), B_WORK], [("1", "b", "workers")]),
     ({"cluster": "b", "status": "submitted"}, [B_SUB, ("1", "b", "submitted")], []),
     ({"job_id": "nope"}, [], [])],
    ids=["cluster", "job_id", "job_id+cluster", "status", "cluster+status", "no-match"],
)
def test_filters_apply_to_the_replay_and_to_live_events(server, listen, params, replayed, live):
    seed(server)
    stream = listen(server, after=0, **params)
    assert keys(stream.events(len(replayed))) == replayed  # read from the database
    seed_more(server)
    assert keys(stream.events(len(live))) == live  # picked from the in-memory tail
    assert no_more_events(stream)


def test_job_stream_needs_the_cluster_when_the_id_is_ambiguous(server, listen):
    seed(server)
    ambiguous = listen(server, "/api/jobs/1/events/stream")
    assert ambiguous.status == 409 and "cluster" in ambiguous.json()["detail"]
    assert listen(server, "/api/jobs/nope/events/stream").status == 404
    assert listen(server, "/api/jobs/1/events/stream", cluster="c").status == 404
    stream = listen(server, "/api/jobs/1/events/stream", cluster="b", after=0)
    only_frontend = listen(server, "/api/jobs/1/events/stream", cluster="b", after=0, status="frontend")
    seed_more(server)
    assert keys(stream.events(3)) == [("1", "b", "submitted"), ("1", "b", "frontend"), ("1", "b", "workers")]
    assert keys(only_frontend.events(1)) == [("1", "b", "frontend")]
    assert no_more_events(stream) and no_more_events(only_frontend, 0)
    # Job 2 lives on one cluster only, so it needs no ?cluster=.
    assert keys(listen(server, "/api/jobs/2/events/stream", after=0).events(3))[-1] == ("2", "b", "frontend")


def test_replay_longer_than_a_page_arrives_in_order_while_writes_continue(server, listen):
    put_many(server, fanout.PAGE + 20, jobs=("j1", "j2", "j3"))
    stream = listen(server, after=0)
    put_many(server, 30, jobs=("j1", "j2"), prefix="live")  # meets the replay somewhere
    records = feed(server)
    assert len(records) == fanout.PAGE + 50
    assert ids(stream.events(len(records), timeout=60)) == [e["id"] for e in records]
    assert no_more_events(stream)


@pytest.mark.parametrize("params", [{}, {"job_id": "j1"}], ids=["all", "filtered"])
def test_resume_from_before_the_in_memory_tail(serve, listen, monkeypatch, params):
    monkeypatch.setattr(fanout, "TAIL", 4)  # the hub keeps 4 to 8 events
    server = serve(**tokens(), **FAST)
    watcher = listen(server)
    put_many(server, 20, jobs=("j1", "j2"))
    watcher.events(20)  # the hub has read all 20 and dropped most of them
    records = feed(server, **params)
    resumed = listen(server, last_event_id=records[1]["id"], **params)
    put_many(server, 4, jobs=("j1", "j2"), prefix="live")
    expected = [e["id"] for e in feed(server, after=records[1]["id"], **params)]
    assert ids(resumed.events(len(expected))) == expected
    assert no_more_events(resumed)


def test_lifetime_ends_the_stream_cleanly_and_a_resume_misses_nothing(serve, listen):
    # One slot: the ended stream must have given it back for the reconnect to be let in.
    server = serve(**tokens(), **FAST, stream_max_lifetime_s=1.0, max_streams=1)
    started = time.monotonic()
    stream = listen(server)
    put_many(server, 2)
    seen = stream.events(2)
    assert all(f.event == "heartbeat" for f in stream.until_end(timeout=10))
    assert time.monotonic() - started >= 0.9  # jittered down by at most 10%
    assert stream.complete  # the last chunk came: an ended response, not a dropped connection
    assert stream.text.endswith("\n\n: maximum stream lifetime reached; reconnect with Last-Event-ID\n\n")
    put_many(server, 2, prefix="between")
    again = open_when_free(listen, server, last_event_id=stream.last_id)
    assert again.status == 200
    seen += again.events(2)
    assert ids(seen) == [e["id"] for e in feed(server)]


def test_a_full_process_answers_503_and_a_dropped_client_frees_its_slot(serve, listen):
    server = serve(**tokens(), **FAST, max_streams=1)
    seed(server)
    # Refused requests take no slot.
    assert listen(server, "/api/jobs/1/events/stream").status == 409
    assert listen(server, "/api/jobs/9/events/stream").status == 404
    assert listen(server, last_event_id="x").status == 422
    held = listen(server)
    assert held.status == 200
    refused = listen(server)
    assert refused.status == 503 and refused.headers["retry-after"] == "5"
    assert "maximum of 1 streams" in refused.json()["detail"]
    held.disconnect()
    # The server notices at its next write (a heartbeat), then the slot is free again.
    again = open_when_free(listen, server)
    assert again.status == 200
    put(server, "1", "benchmark", cluster="a")
    assert keys(again.events(1)) == [("1", "a", "benchmark")]


def test_max_streams_zero_turns_streams_off(serve, listen):
    server = serve(**tokens(), **FAST, max_streams=0)
    response = listen(server)
    assert response.status == 503 and response.headers["retry-after"] == "5"
    assert server.get("/api/events").status_code == 200  # the polled feed still works


@pytest.mark.parametrize("which, status", [("read", 200), ("write", 200), (None, 401), ("wrong", 401)])
def test_streams_take_either_token(server, listen, which, status):
    token = {"read": server.settings.read_token, "write": server.token, None: None, "wrong": "nope"}[which]
    stream = listen(server, token=token)
    assert stream.status == status
    if status == 401:
        assert stream.headers["www-authenticate"] == "Bearer"
    else:
        put(server, "j1")
        assert keys(stream.events(1)) == [("j1", None, "workers")]


@pytest.mark.parametrize(
    "path, cursor, query, field",
    [(STREAM, "abc", {}, None), (STREAM, "-1", {}, None), (STREAM, str(2**63), {}, None),
     (STREAM, "1.5", {}, None), (STREAM, None, {"after": "-1"}, "after"), (STREAM, None, {"after": "x"}, "after"),
     (STREAM, None, {"after": str(2**63)}, "after"), (STREAM, None, {"status": "bogus"}, "status"),
     ("/api/jobs/j1/events/stream", None, {"status": "bogus"}, "status"),
     ("/api/jobs/j1/events/stream", "abc", {}, None)],
)
def test_bad_cursor_or_status_is_422(server, listen, path, cursor, query, field):
    put(server, "j1")
    response = listen(server, path, last_event_id=cursor, **query)
    assert response.status == 422
    body = response.json()
    if field is None:
        assert body["detail"].startswith("Last-Event-ID must be an event id (an integer from 0 to 9223372036854775807)")
    else:
        assert body["errors"][0]["loc"] == ["query", field]


def test_superscript_digit_in_last_event_id_is_422(server, listen):
    assert listen(server, last_event_id="\u00b2").status == 422


def test_largest_cursor_is_accepted_and_waits(server, listen):
    stream = listen(server, last_event_id=2**63 - 1)
    put(server, "j1")
    assert stream.status == 200 and no_more_events(stream, 0.5)  # nothing is above it


@pytest.fixture
def serve_process(database):
    """`collector serve` on the session database with a token and 0.3 s heartbeats."""
    proc = ServerProcess(collector_command("serve", "--port", "0", "--db", database.url),
                         child_env(SRTCTL_STATUS_TOKEN="w", COLLECTOR_STREAM_HEARTBEAT="0.3"))
    yield proc, LiveServer(url=proc.url, settings=Settings(), token="w")
    proc.stop()


def test_collector_serve_streams(serve_process, listen):
    _, client = serve_process
    stream = listen(client)
    assert stream.next(timeout=5) == sse.Frame(None, "heartbeat", "{}")  # the variable reached it
    put(client, "serve-1")
    (frame,) = stream.events(1)
    assert (frame.json()["job_id"], frame.json()["status"]) == ("serve-1", "workers")
    resumed = listen(client, after=int(frame.id) - 1)
    assert ids(resumed.events(1)) == [int(frame.id)]


def test_collector_serve_sigterm_ends_streams_cleanly(serve_process, listen):
    proc, client = serve_process
    stream = listen(client)
    stream.next(timeout=5)
    proc.proc.send_signal(signal.SIGTERM)
    stream.until_end(timeout=10)
    assert stream.complete and stream.comments[-1].startswith("server shutting down")
