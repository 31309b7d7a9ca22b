"""LogStreamer and the capture outbox against live collectors: chunks, offsets, resends, final flush, deletion."""

from __future__ import annotations

import json
import os
import random
import string
import time

from collector.reporter.streamer import FINAL_TIMEOUT
from collector.reporter.streamer import LogStreamer
from collector.reporter.transport import Transport
from tests.helpers import DROP
from tests.helpers import HANG
from tests.helpers import closed_port_url
from tests.helpers import log_files
from tests.helpers import new_id
from tests.helpers import wait_for

MiB = 1 << 20


def text(size: int, seed: int = 0) -> bytes:
    rng = random.Random(seed)
    return "".join(rng.choice(string.ascii_letters + "\n") for _ in range(size)).encode()


def write(path, data: bytes, mode: str = "wb") -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, mode) as handle:
        handle.write(data)


def log_content(api, job_id, name) -> bytes:
    """A streamed file's whole text, paged with next_offset."""
    out, offset = b"", 0
    while True:
        body = api.get(f"/api/jobs/{job_id}/logs", params={"file": name, "offset": offset}).json()
        if body["next_offset"] == offset:
            return out
        out += body["data"].encode()
        offset = body["next_offset"]


def uploads(wire, kind="logs") -> list[tuple[str, int, int, str | None]]:
    """(file, offset, length, final) of every upload the recorder saw."""
    return [(r.params["file"], int(r.params["offset"]), len(r.body), r.params.get("final"))
            for r in wire.of("POST") if r.path.endswith("/" + kind)]


def test_new_bytes_land_in_chunks_of_at_most_1_mib_over_one_connection(api, recorder, tmp_path):
    job_id = new_id("s")
    big = text(2 * MiB + 1000)
    write(tmp_path / "run.out", big)
    write(tmp_path / "sub" / "deeper" / "worker.log", b"worker line\n")
    for name in ("a.err", "b.csv", "c.jsonl"):
        write(tmp_path / name, name.encode() + b"\n")
    for ignored in ("notes.txt", "out-1.parquet", "run.out.bak"):
        write(tmp_path / ignored, b"never sent")
    wire = recorder(api.url)
    streamer = LogStreamer(Transport([wire.url], api.token), job_id, str(tmp_path), cluster="c1")
    assert streamer.flush() is True
    assert sorted(uploads(wire)) == sorted([
        ("a.err", 0, 6, None), ("b.csv", 0, 6, None), ("c.jsonl", 0, 8, None),
        ("run.out", 0, MiB, None), ("run.out", MiB, MiB, None), ("run.out", 2 * MiB, 1000, None),
        ("sub/deeper/worker.log", 0, 12, None),
    ])
    assert {r.params["cluster"] for r in wire.of("POST")} == {"c1"}
    assert {r.headers["Content-Type"] for r in wire.of("POST")} == {"application/octet-stream"}
    assert wire.connections == 1  # persistent
    assert log_content(api, job_id, "run.out") == big
    assert log_files(api, job_id)["sub/deeper/worker.log"] == (12, False)
    assert api.get(f"/api/jobs/{job_id}").json()["cluster"] == "c1"

    write(tmp_path / "run.out", b"appended\n", "ab")
    sent = len(wire.requests)
    assert streamer.flush() is True
    assert uploads(wire)[sent - len(wire.requests):] == [("run.out", len(big), 9, None)]
    assert streamer.flush() is True
    assert len(wire.requests) == sent + 1  # nothing new, nothing sent
    assert log_content(api, job_id, "run.out") == big + b"appended\n"


def test_a_chunk_is_resent_verbatim_until_acknowledged(api, recorder, tmp_path):
    job_id = new_id("s")
    write(tmp_path / "a.log", b"first\n")
    answers = iter(["lost", "lost", "doctored", "forward"])

    def flaky(request, wire):
        what = next(answers, "forward")
        if what == "forward":
            return None
        wire.forwarded(request)  # the collector stores it; the reporter never learns
        return DROP if what == "lost" else (200, {"Content-Type": "application/json"},
                                            b'{"job_id": "someone-else", "stored": 1}')

    wire = recorder(api.url, flaky)
    streamer = LogStreamer(Transport([wire.url], api.token), job_id, str(tmp_path))
    assert streamer.flush() is False  # both attempts lost
    write(tmp_path / "a.log", b"second\n", "ab")  # grows meanwhile: the resend stays the same bytes
    assert streamer.flush() is False  # acknowledged for another job: not an acknowledgement
    assert streamer.acked[wire.url] == {}
    assert streamer.flush() is True
    posts = wire.of("POST")
    assert [(r.params["offset"], r.body) for r in posts] == [("0", b"first\n")] * 4 + [("6", b"second\n")]
    assert [(r.answer[0], json.loads(r.answer[1])) for r in posts[2:]] == [
        (200, {"job_id": "someone-else", "stored": 1}),
        (200, {"job_id": job_id, "stored": 0}),  # already stored by the lost ones
        (200, {"job_id": job_id, "stored": 1}),
    ]
    assert log_content(api, job_id, "a.log") == b"first\nsecond\n"


def test_stop_flushes_with_final_1_on_every_file(api, recorder, tmp_path):
    job_id = new_id("s")
    write(tmp_path / "done.out", b"all sent\n")
    write(tmp_path / "grows.err", b"part one\n")
    wire = recorder(api.url)
    streamer = LogStreamer(Transport([wire.url], api.token), job_id, str(tmp_path))
    assert streamer.flush() is True
    write(tmp_path / "grows.err", b"part two\n", "ab")
    write(tmp_path / "late.log", b"new at the end\n")
    sent = len(wire.requests)
    assert streamer.stop() is True
    assert sorted(uploads(wire)[sent:]) == [
        ("done.out", 9, 0, "1"),  # an empty final chunk closes a file already sent
        ("grows.err", 9, 9, "1"),
        ("late.log", 0, 15, "1"),
    ]
    assert log_files(api, job_id) == {"done.out": (9, True), "grows.err": (18, True), "late.log": (15, True)}
    assert FINAL_TIMEOUT == 5.0


def test_the_thread_streams_every_interval_until_stopped(api, tmp_path):
    job_id = new_id("s")
    streamer = LogStreamer(Transport([api.url], api.token), job_id, str(tmp_path), interval=0.05).start()
    try:
        write(tmp_path / "job.out", b"line 1\n")
        wait_for(lambda: log_files(api, job_id).get("job.out") == (7, False))
        write(tmp_path / "job.out", b"line 2\n", "ab")
        wait_for(lambda: log_files(api, job_id).get("job.out") == (14, False))
    finally:
        started = time.monotonic()
        assert streamer.stop() is True
    assert time.monotonic() - started < 1.0
    assert log_files(api, job_id) == {"job.out": (14, True)}
    assert log_content(api, job_id, "job.out") == b"line 1\nline 2\n"


def test_stop_is_bounded_when_an_endpoint_hangs(api, recorder, tmp_path):
    job_id = new_id("s")
    write(tmp_path / "a.out", b"x\n")
    silent = recorder(script=lambda *_: HANG)
    streamer = LogStreamer(Transport([silent.url, api.url], api.token), job_id, str(tmp_path), interval=0.05,
                           final_timeout=0.5).start()
    wait_for(lambda: silent.requests)  # a regular pass is stuck on the silent endpoint
    started = time.monotonic()
    assert streamer.stop() is False
    assert time.monotonic() - started < 0.8


def test_a_down_endpoint_does_not_hold_back_the_others(api, second_api, tmp_path):
    job_id = new_id("s")
    write(tmp_path / "a.out", b"x" * 10)
    write(tmp_path / "b.out", b"y" * 20)
    down = closed_port_url()
    streamer = LogStreamer(Transport([api.url, down, second_api.url], api.token), job_id, str(tmp_path))
    assert streamer.flush() is False
    assert streamer.stop() is False
    for collector in (api, second_api):
        assert log_files(collector, job_id) == {"a.out": (10, True), "b.out": (20, True)}
    assert streamer.acked[down] == {}


def capture(api, job_id, name) -> bytes | None:
    response = api.get(f"/api/jobs/{job_id}/captures", params={"file": name})
    return response.content if response.status_code == 200 else None


def test_segments_upload_in_chunks_and_are_deleted_once_every_endpoint_acked(api, second_api, recorder, tmp_path):
    job_id = new_id("s")
    outbox = tmp_path / "tachometer-outbox"
    segment = random.Random(1).randbytes(2 * MiB + 5)
    write(outbox / "out-1.parquet", segment)
    write(outbox / "out-2.parquet", b"")
    for kept in (".out-3.parquet", "out-4.parquet.tmp"):  # still being written, by the rename convention
        write(outbox / kept, b"partial")
    wire = recorder(api.url)
    streamer = LogStreamer(Transport([wire.url, second_api.url], api.token), job_id, None, outbox=str(outbox),
                           cluster="c2")
    assert streamer.flush() is True  # files still being written are not segments yet
    assert sorted(os.listdir(outbox)) == [".out-3.parquet", "out-4.parquet.tmp"]
    total = len(segment)
    assert [(r.params["file"], int(r.params["offset"]), int(r.params["total"]), len(r.body), r.params["cluster"])
            for r in wire.of("POST")] == [
        ("out-1.parquet", 0, total, MiB, "c2"), ("out-1.parquet", MiB, total, MiB, "c2"),
        ("out-1.parquet", 2 * MiB, total, 5, "c2"), ("out-2.parquet", 0, 0, 0, "c2")]
    for collector in (api, second_api):
        assert capture(collector, job_id, "out-1.parquet") == segment
        assert capture(collector, job_id, "out-2.parquet") == b""
    assert streamer.outbox is not None
    assert streamer.outbox.uploaded == ["out-1.parquet", "out-2.parquet"]


def test_a_segment_stays_until_the_down_endpoint_acknowledges_it(api, recorder, tmp_path):
    job_id = new_id("s")
    outbox = tmp_path / "outbox"
    write(outbox / "out-7.parquet", b"PAR1" * 1000)
    state = {"down": True}
    wire = recorder(api.url, lambda *_: DROP if state["down"] else None)
    streamer = LogStreamer(Transport([api.url, wire.url], api.token), job_id, None, outbox=str(outbox))
    assert streamer.flush() is False
    assert os.listdir(outbox) == ["out-7.parquet"]
    assert capture(api, job_id, "out-7.parquet") == b"PAR1" * 1000  # the up endpoint has it all
    state["down"] = False
    assert streamer.flush() is True
    assert os.listdir(outbox) == []
    status, body = wire.of("POST")[-1].answer
    assert (status, json.loads(body)) == (200, {"job_id": job_id, "next_offset": 4000, "complete": True})


def test_a_wrong_acknowledgement_or_a_changed_file_keeps_the_segment(api, recorder, tmp_path):
    job_id = new_id("s")
    outbox = tmp_path / "outbox"
    write(outbox / "out-1.parquet", b"a" * 100)
    doctored = b'{"job_id": "%s", "next_offset": 99, "complete": true}' % job_id.encode()
    lying = recorder(api.url, lambda *_: (200, {"Content-Type": "application/json"}, doctored))
    streamer = LogStreamer(Transport([lying.url], api.token), job_id, None, outbox=str(outbox))
    assert streamer.flush() is False
    assert os.listdir(outbox) == ["out-1.parquet"]

    def append_meanwhile(request, wire):
        write(outbox / "out-2.parquet", b"more", "ab")  # a writer that broke the rename convention
        return None

    write(outbox / "out-2.parquet", b"b" * 100)
    os.unlink(outbox / "out-1.parquet")
    wire = recorder(api.url, append_meanwhile)
    streamer = LogStreamer(Transport([wire.url], api.token), job_id, None, outbox=str(outbox))
    assert streamer.flush() is False
    assert os.listdir(outbox) == ["out-2.parquet"]
    assert capture(api, job_id, "out-2.parquet") == b"b" * 100


def test_a_refused_file_is_skipped_a_refusing_endpoint_left_for_the_next_pass(api, recorder, tmp_path):
    job_id = new_id("s")
    # The collector already holds other bytes at a.log's offset 0: a.log gets 409, b.log goes on.
    assert api.post(f"/api/jobs/{job_id}/logs", params={"file": "a.log", "offset": 0}, data=b"other",
                    headers={"Content-Type": "application/octet-stream"}).status_code == 200
    write(tmp_path / "a.log", b"mine!")
    write(tmp_path / "b.log", b"fine\n")
    streamer = LogStreamer(Transport([api.url], api.token), job_id, str(tmp_path))
    assert streamer.flush() is False
    assert streamer.acked[api.url] == {"b.log": 5}
    assert log_content(api, job_id, "b.log") == b"fine\n"
    # A 403 is about the endpoint, not the file: one request per pass, not one per file.
    forbidden = recorder(script=lambda *_: (403, {"Content-Type": "application/json"}, b'{"detail": "no"}'))
    streamer = LogStreamer(Transport([forbidden.url], "read-token"), job_id, str(tmp_path))
    assert streamer.flush() is False
    assert streamer.flush() is False
    assert [r.params["file"] for r in forbidden.requests] == ["a.log", "a.log"]
