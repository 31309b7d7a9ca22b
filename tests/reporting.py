"""Helpers for the reporter tests: a recording HTTP server, a second collector, reads of what landed.

The Recorder is a tiny HTTP server that records every request and answers by a script. By default it forwards each request to a real collector (``upstream``) and passes the answer
back, so the reporter talks to real collector behaviour while the test sees every request on
the wire; ``script`` can instead drop the connection (no answer), hang, or answer itself
(a redirect, a 403, a doctored acknowledgement).
"""

from __future__ import annotations

import dataclasses
import http.server
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable
from collections.abc import Iterator

import pytest
import requests

from collector.migrations import upgrade

DROP = "drop"  # read the request, close the connection without a word
HANG = "hang"  # read the request and never answer (until the server stops)


@dataclasses.dataclass
class Request:
    """One request as it arrived."""

    method: str
    path: str
    params: dict[str, str]
    headers: dict[str, str]
    body: bytes
    connection: int
    answer: tuple[int, bytes] | None = None  # what the client was sent, when it was sent something


Answer = tuple[int, dict[str, str], bytes]
Script = Callable[[Request, "Recorder"], "Answer | str | None"]


class Recorder:
    """A threaded HTTP/1.1 server on an ephemeral loopback port (keep-alive, so connections can be counted)."""

    def __init__(self, upstream: str | None = None, script: Script | None = None) -> None:
        self.upstream = upstream
        self.script = script
        self.requests: list[Request] = []
        self.connections = 0
        self._released = threading.Event()
        self._lock = threading.Lock()
        self._forward = requests.Session()
        recorder = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                with recorder._lock:
                    recorder.connections += 1
                    self.connection_number = recorder.connections

            def log_message(self, *args) -> None:
                pass

            def handle_one(self) -> None:
                recorder._handle(self)

            do_GET = do_POST = do_PUT = do_DELETE = handle_one

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def of(self, method: str, path_prefix: str = "") -> list[Request]:
        """The recorded requests with this method whose path starts with ``path_prefix``."""
        return [r for r in self.requests if r.method == method and r.path.startswith(path_prefix)]

    def close(self) -> None:
        """Release hanging requests and stop serving."""
        self._released.set()
        self.server.shutdown()
        self.server.server_close()
        self._forward.close()

    def _handle(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        split = urllib.parse.urlsplit(handler.path)
        length = int(handler.headers.get("Content-Length") or 0)
        request = Request(handler.command, split.path, dict(urllib.parse.parse_qsl(split.query)),
                          dict(handler.headers.items()), handler.rfile.read(length) if length else b"",
                          handler.connection_number)
        with self._lock:
            self.requests.append(request)
        answer = self.script(request, self) if self.script else None
        if answer == DROP:
            handler.close_connection = True
            return
        if answer == HANG:
            self._released.wait()
            handler.close_connection = True
            return
        status, headers, body = answer if answer is not None else self.forwarded(request)
        request.answer = (status, body)
        handler.send_response(status)
        for name, value in headers.items():
            handler.send_header(name, value)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def forwarded(self, request: Request) -> Answer:
        """The upstream collector's answer to ``request``."""
        skip = {"host", "content-length", "connection", "accept-encoding"}
        response = self._forward.request(
            request.method, self.upstream + request.path, params=request.params, data=request.body,
            headers={k: v for k, v in request.headers.items() if k.lower() not in skip},
            allow_redirects=False, timeout=10)
        headers = {"Content-Type": response.headers.get("Content-Type", "application/json")}
        return response.status_code, headers, response.content


@pytest.fixture
def recorder() -> Iterator[Callable[..., Recorder]]:
    """Factory: start a Recorder (stopped after the test)."""
    started: list[Recorder] = []

    def start(upstream: str | None = None, script: Script | None = None) -> Recorder:
        started.append(Recorder(upstream, script))
        return started[-1]

    yield start
    for each in started:
        each.close()


@pytest.fixture(scope="module")
def second_database(new_database) -> str:
    """Another migrated database of the backend under test, for a second collector."""
    url = new_database()
    upgrade(url)
    return url


@pytest.fixture
def second_api(serve, second_database, api):
    """A second collector with its own database and ``api``'s tokens (its jobs stay across the module's tests)."""
    return serve(database_url=second_database, write_token=api.token, read_token=api.settings.read_token)


def new_id(prefix: str) -> str:
    """A job id no other test uses (the second collector's database is shared by a module)."""
    return prefix + uuid.uuid4().hex[:10]


def detail(api, job_id) -> dict:
    """The job's detail, which must exist."""
    response = api.get(f"/api/jobs/{job_id}")
    assert response.status_code == 200, response.text
    return response.json()


def log_files(api, job_id) -> dict[str, tuple[int, bool]]:
    """The job's streamed files: name to (size, final); empty while nothing has arrived."""
    response = api.get(f"/api/jobs/{job_id}/logs")
    if response.status_code == 404:
        return {}
    return {f["file"]: (f["size"], f["final"]) for f in response.json()["files"]}


def wait_for(condition, timeout: float = 10.0) -> None:
    """Poll ``condition`` until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def closed_port_url() -> str:
    """A loopback URL nothing listens on (connection refused at once)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"
