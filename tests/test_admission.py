"""The per-process cap on ordinary requests: a held response holds a slot, streams never do."""

from __future__ import annotations

import socket
import struct
import uuid

import pytest
import requests

from tests import sse
from tests.helpers import MiB
from tests.helpers import accepted

SEGMENT = "out-0.parquet"
# Larger than loopback's socket buffers, so an unread download keeps its request running.
SIZE = 24 * MiB


@pytest.fixture
def one_slot(serve):
    """A collector that runs one ordinary request at a time."""
    return serve(write_token="w-" + uuid.uuid4().hex, threads=1, stream_heartbeat_s=0.3)


def held_download(api) -> requests.Response:
    """A capture download the client does not read: its request keeps running in the server."""
    chunk = b"\xab" * MiB
    for offset in range(0, SIZE, MiB):
        accepted(api, "held", SEGMENT, offset, SIZE, chunk)
    response = requests.get(api.url + "/api/jobs/held/captures", params={"file": SEGMENT}, stream=True,
                            headers={"Authorization": f"Bearer {api.token}"}, timeout=10)
    assert response.status_code == 200
    return response


def test_a_request_past_the_cap_waits_for_the_running_one(one_slot):
    download = held_download(one_slot)
    with pytest.raises(requests.exceptions.ReadTimeout):
        one_slot.get("/api/jobs", timeout=1)
    download.close()  # the server's write fails, the response closes, the slot comes back
    assert one_slot.get("/api/jobs", timeout=10).status_code == 200


def test_streams_take_no_slot(one_slot):
    streams = [sse.connect(one_slot.url, "/api/events/stream", token=one_slot.token) for _ in range(3)]
    try:
        assert [s.status for s in streams] == [200, 200, 200]
        assert one_slot.get("/api/jobs", timeout=5).status_code == 200
    finally:
        for stream in streams:
            stream.close()


@pytest.mark.parametrize("path, status", [("/api/jobs", 200), ("/api/jobs/nope", 404), ("/api/nope", 404),
                                          ("/api/health", 200)])
def test_every_answer_gives_its_slot_back(one_slot, path, status):
    for _ in range(20):
        assert one_slot.get(path, timeout=5).status_code == status
    assert requests.get(one_slot.url + "/api/jobs", timeout=5).status_code == 401
    too_big = requests.put(one_slot.url + "/api/jobs/x", data=b"x" * (2 * MiB), timeout=5,
                           headers={"Authorization": f"Bearer {one_slot.token}"})
    assert too_big.status_code == 413
    assert one_slot.get("/api/jobs", timeout=5).status_code == 200


@pytest.fixture
def one_slot_shedding(serve):
    """One slot, and a one-second queue: a request that waits longer is shed."""
    return serve(write_token="w-" + uuid.uuid4().hex, threads=1, queue_timeout_s=1.0)


def test_a_request_that_waited_past_the_queue_timeout_is_shed_and_never_run(one_slot_shedding):
    api = one_slot_shedding
    download = held_download(api)
    body = {"status": "workers", "updated_at": "2025-01-26T10:35:00Z"}
    shed = api.put("/api/jobs/shed-1", json=body, headers={"X-Request-ID": "shed-req-1"}, timeout=10)
    assert shed.status_code == 503
    assert shed.headers["Retry-After"] == "1"
    assert shed.headers["X-Request-ID"] == "shed-req-1"
    assert shed.json() == {
        "detail": "the server is busy: this request waited more than 1 s for a free request slot and was not run; "
                  "try again",
        "request_id": "shed-req-1",
    }
    download.close()
    # Not run: the job was never created, and the slot is free for the next request at once.
    assert api.get("/api/jobs/shed-1", timeout=5).status_code == 404
    assert api.put("/api/jobs/shed-1", json=body, timeout=5).status_code == 200
    assert 'collector_requests_shed_total 1.0' in api.get("/metrics").text


def test_clients_that_reset_after_reading_never_leak_a_slot(one_slot):
    # What browsers and killed scripts do: read the answer, then reset instead of closing.
    # werkzeug's server (this fixture) fails before it closes the response; the slot must come back anyway.
    port = int(one_slot.url.rsplit(":", 1)[1])
    for _ in range(50):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
            client.sendall(b"GET /api/health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert client.recv(4096).startswith(b"HTTP/1.1 200")
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    assert one_slot.get("/api/jobs", timeout=1).status_code == 200
