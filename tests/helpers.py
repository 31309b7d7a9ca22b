"""The test helpers: waiting, a fake clock, servers, clients and the request payloads tests share.

Test modules import from here (and from tests/processes.py for child processes, tests/sse.py
for event streams, tests/faultload.py for the fault load), never from one another
(tests/test_suite_layout.py checks); the fixtures they share are in tests/conftest.py.

- waiting: ``wait_for``; time: ``FakeClock``, a clock to give the janitor; the browser: ``CHROMIUM``
- servers: ``LiveServer`` (a collector in this process), ``Recorder`` (an HTTP server that records
  every request and answers by a script, forwarding to a real collector by default)
- clients: ``Reporter`` (what an unmodified srtctl reporter sends, request for request),
  ``raw_exchange`` (raw HTTP on a socket), ``closed_port_url``
- payloads and reads: jobs (``SUBMIT``, ``put``, ``detail``), clusters (``submit``, ``report``,
  ``reported``, ``listing``), captures (``send``, ``accepted``), logs (``log_files``)
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import http.server
import socket
import sys
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any
from typing import TypeVar

import requests
from flask import Flask

from collector import per_process
from collector.contract import format_timestamp
from collector.janitor import Janitor
from collector.janitor import get_janitor
from collector.settings import Settings
from tests.processes import ServerProcess
from tests.processes import child_env

T = TypeVar("T")

# The browser of the page's tests (the ``browser`` and ``page`` fixtures): Debian's Chromium,
# with flags for a browser that talks to nothing but the servers under test.
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
WAIT_MS = 10_000

# -- waiting and time ------------------------------------------------------------------


def stop_app(app: Flask) -> None:
    """Stop an in-process app's threads and wait for them, then close its pool.

    Closing the hub ends its streams and tells every background thread to stop; their last
    statements (a janitor giving up its role, a dispatcher recording answers) are done
    before the next test empties the tables, which could otherwise meet them in a deadlock.
    Call it after the app's HTTP server has stopped taking requests.
    """
    hub = app.extensions["collector.streams"]
    hub.close()
    assert per_process.join_all(app.extensions, timeout=10) == [], "background threads still running"
    assert hub.join(timeout=10), "the feed reader is still running"
    app.extensions["collector.db"].dispose()


def wait_for(check: Callable[[], T | None], timeout: float = 15.0, what: str = "the condition",
             every: float = 0.05) -> T:
    """Poll ``check`` until it returns something truthy, and return that; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}; last: {value!r}"
        time.sleep(every)


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class FakeClock:
    """A clock that stands still until a test moves it (give it to a janitor: ``serve(clock=...)``)."""

    def __init__(self, start: dt.datetime | None = None) -> None:
        self.now = start or utc_now()

    def __call__(self) -> dt.datetime:
        return self.now

    def set(self, moment: dt.datetime) -> dt.datetime:
        self.now = moment
        return moment


# -- servers -----------------------------------------------------------------------------


@dataclasses.dataclass
class LiveServer:
    """A collector serving on an ephemeral loopback port in this process."""

    url: str
    settings: Settings
    token: str | None = None
    app: Flask | None = None

    @property
    def janitor(self) -> Janitor:
        """The stale-job janitor of this collector."""
        assert self.app is not None, "not a server of the serve fixture"
        return get_janitor(self.app)

    def request(self, method: str, path: str, *, token: str | None | bool = True, **kwargs: Any) -> requests.Response:
        """One request on a fresh connection (as the srtctl reporter sends them)."""
        headers = kwargs.pop("headers", {})
        bearer = self.token if token is True else token or None
        if bearer:
            headers.setdefault("Authorization", f"Bearer {bearer}")
        kwargs.setdefault("timeout", 10)
        kwargs.setdefault("allow_redirects", False)
        return requests.request(method, self.url + path, headers=headers, **kwargs)

    def get(self, path: str, **kwargs: Any) -> requests.Response:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> requests.Response:
        return self.request("POST", path, **kwargs)

    def put(self, path: str, **kwargs: Any) -> requests.Response:
        return self.request("PUT", path, **kwargs)

    def delete(self, path: str, **kwargs: Any) -> requests.Response:
        return self.request("DELETE", path, **kwargs)


DROP = "drop"  # read the request, close the connection without a word
HANG = "hang"  # read the request and never answer (until the server stops)


@dataclasses.dataclass
class Request:
    """One request as it arrived at a Recorder."""

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
    """A threaded HTTP/1.1 server on an ephemeral loopback port (keep-alive, so connections can be counted).

    It records every request and answers by ``script``. By default it forwards each request to
    a real collector (``upstream``) and passes the answer back, so a reporter talks to real
    collector behaviour while the test sees every request on the wire; ``script`` can instead
    drop the connection (no answer), hang, or answer itself (a redirect, a 403, a doctored
    acknowledgement).
    """

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
            connection_number = 0

            def setup(self) -> None:
                super().setup()
                with recorder._lock:
                    recorder.connections += 1
                    self.connection_number = recorder.connections

            def log_message(self, *args: Any) -> None:
                pass

            def handle_one(self) -> None:
                recorder._handle(self)

            # OPTIONS too: a browser's CORS preflight is a request the test may need to see (and answer).
            do_GET = do_POST = do_PUT = do_DELETE = do_OPTIONS = handle_one

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

    def _handle(self, handler: Any) -> None:
        # ``handler`` is the Handler above (its class is local to __init__).
        split = urllib.parse.urlsplit(handler.path)
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        if len(body) < length:
            # The client went away mid-body (killed, say): no HTTP server hands that on as a request.
            handler.close_connection = True
            return
        request = Request(handler.command, split.path, dict(urllib.parse.parse_qsl(split.query)),
                          dict(handler.headers.items()), body, handler.connection_number)
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
        assert not isinstance(answer, str), f"unknown script answer {answer!r}"
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
        assert self.upstream is not None, "a Recorder without an upstream must answer by its script"
        skip = {"host", "content-length", "connection", "accept-encoding"}
        response = self._forward.request(
            request.method, self.upstream + request.path, params=request.params, data=request.body,
            headers={k: v for k, v in request.headers.items() if k.lower() not in skip},
            allow_redirects=False, timeout=10)
        headers = {"Content-Type": response.headers.get("Content-Type", "application/json")}
        return response.status_code, headers, response.content


# -- clients -----------------------------------------------------------------------------

STARTED_METADATA: dict[str, Any] = {
    "model": {"path": "/models/deepseek-r1", "precision": "fp8"},
    "resources": {
        "gpu_type": "b200",
        "gpus_per_node": 8,
        "prefill_workers": 1,
        "decode_workers": 4,
        "agg_workers": None,
        "cpu_allocation": "0-143",
        "cpu_check": "ok",
    },
    "benchmark": {"type": "sa-bench"},
    "backend_type": "sglang",
    "frontend_type": "dynamo",
    "head_node": "node-01",
    "log_dir": "/lustre/outputs/12345/logs/12345_1P_4D",
}


def _reporter_stamp() -> str:
    return utc_now().isoformat().replace("+00:00", "Z")


class Reporter:
    """The srtctl StatusReporter and create_job_record for one job and one endpoint, request for request.

    Kept in the tests so the suite checks the collector against the client's real behaviour:
    JSON bodies built with exclude_none, 5 s timeout, redirects never followed, the job id
    unquoted in the path, success only on exactly 201 / 200.
    """

    def __init__(self, endpoint: str, job_id: str, token: str | None = None) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.job_id = job_id
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def _send(self, method: str, url: str, payload: dict[str, Any], ok: int) -> bool:
        body = {k: v for k, v in payload.items() if v is not None}
        response = requests.request(method, url, json=body, headers=self.headers, timeout=5.0, allow_redirects=False)
        return response.status_code == ok

    def create(self, job_name: str, *, cluster: str | None = None, recipe: str | None = None,
               metadata: dict[str, Any] | None = None, submitted_at: str | None = None) -> bool:
        payload = dict(job_id=self.job_id, job_name=job_name, submitted_at=submitted_at or _reporter_stamp(),
                       cluster=cluster, recipe=recipe, metadata=metadata)
        return self._send("POST", f"{self.endpoint}/api/jobs", payload, 201)

    def report(self, status: str, stage: str | None = None, message: str | None = None, **extra: Any) -> bool:
        payload = dict(status=status, updated_at=extra.pop("updated_at", None) or _reporter_stamp(), stage=stage,
                       message=message, **extra)
        return self._send("PUT", f"{self.endpoint}/api/jobs/{self.job_id}", payload, 200)

    def report_started(self, *, job_name: str | None, cluster: str | None, head: str = "node-01") -> bool:
        metadata = {**STARTED_METADATA, "head_node": head, "job_name": job_name, "cluster": cluster}
        stamp = _reporter_stamp()
        return self.report("starting", "starting", f"Job started on {head}", started_at=stamp,
                           updated_at=stamp, metadata=metadata)

    def report_completed(self, exit_code: int, logs_url: str | None = None) -> bool:
        ok = exit_code == 0
        stamp = _reporter_stamp()
        return self.report(
            "completed" if ok else "failed",
            "cleanup",
            "Benchmark completed successfully" if ok else f"Job failed with exit code {exit_code}",
            completed_at=stamp,
            updated_at=stamp,
            exit_code=exit_code,
            logs_url=logs_url,
        )

    def report_artifacts(self, logs_url: str) -> bool:
        return self.report("benchmark", "cleanup", "Artifacts uploaded", logs_url=logs_url)

    def run_lifecycle(self, *, job_name: str, cluster: str | None, exit_code: int = 0) -> list[bool]:
        """Every report a successful sweep sends, in order."""
        return [
            self.report_started(job_name=job_name, cluster=cluster),
            self.report("starting", "head_infrastructure", "Starting head infrastructure"),
            self.report("workers", "workers", "Starting workers"),
            self.report("frontend", "frontend", "Starting frontend"),
            self.report("frontend", "frontend", "Inference endpoint ready"),
            self.report("benchmark", "benchmark", "Running benchmark"),
            self.report_artifacts(f"s3://bucket/outputs/{self.job_id}/"),
            self.report_completed(exit_code, logs_url=f"s3://bucket/outputs/{self.job_id}/"),
        ]


def raw_exchange(api: LiveServer, head: bytes, body: bytes = b"", *, half_close: bool = False) -> str:
    """Send ``head`` (request line and headers, each ending CRLF) plus the bearer token, then ``body``.

    Raw HTTP on a socket, for what a well-behaved client library will not send. Reads the
    reply until the server closes the connection; ``half_close`` closes our write side
    first, as a client that gave up mid-body would.
    """
    parts = urllib.parse.urlsplit(api.url)
    assert parts.hostname is not None and parts.port is not None and api.token is not None
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(head + b"Authorization: Bearer " + api.token.encode() + b"\r\n\r\n" + body)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    return reply.decode("utf-8", "replace")


def closed_port_url() -> str:
    """A loopback URL nothing listens on (connection refused at once)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


# -- payloads and reads ------------------------------------------------------------------

# Jobs.
SUBMIT: dict[str, Any] = {
    "job_id": "12345",
    "job_name": "benchmark-run",
    "cluster": "gpu-cluster-01",
    "recipe": "configs/benchmark.yaml",
    "submitted_at": "2025-01-26T10:30:00Z",
    "metadata": {"tags": ["pipeline:98765", "suite:kv-router-comparison"]},
}


def put(api: LiveServer, job_id: str, status: str = "workers", *, updated_at: str = "2025-01-26T10:35:00Z",
        **fields: Any) -> requests.Response:
    return api.put(f"/api/jobs/{job_id}", json={"status": status, "updated_at": updated_at, **fields})


def detail(api: LiveServer, job_id: str, **params: Any) -> dict[str, Any]:
    """The job's detail, which must exist."""
    response = api.get(f"/api/jobs/{job_id}", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def new_id(prefix: str) -> str:
    """A job id no other test uses (for databases that outlive one test)."""
    return prefix + uuid.uuid4().hex[:10]


# Clusters.
IDLE: dict[str, Any] = {"nodes": [{"name": "n1", "state": "idle"}], "partitions": [{"name": "debug", "state": "up"}]}


def probe_stamp() -> str:
    """Now, as a probe stamps its report (whole seconds)."""
    return format_timestamp(utc_now().replace(microsecond=0))


def listing(api: LiveServer, **kwargs: Any) -> list[dict[str, Any]]:
    """GET /api/clusters: every cluster."""
    response = api.get("/api/clusters", **kwargs)
    assert response.status_code == 200, response.text
    return response.json()["clusters"]


def report(api: LiveServer, cluster: str = "c1", *, token: str | bool | None = True,
           **fields: Any) -> requests.Response:
    """A probe's report of ``cluster`` (an idle node unless ``fields`` say otherwise)."""
    body = {"probed_at": probe_stamp(), **IDLE, **fields}
    return api.put(f"/api/clusters/{cluster}/status", json=body, token=token)


def reported(api: LiveServer, cluster: str = "c1", **fields: Any) -> dict[str, Any]:
    """A probe's report that must be accepted; its answer."""
    response = report(api, cluster, **fields)
    assert response.status_code == 200, response.text
    return response.json()


def submit(api: LiveServer, job_id: str, cluster: str = "c1", submitted_at: str = "2026-12-03T08:00:00Z") -> None:
    """POST a job of ``cluster``."""
    body = {"job_id": job_id, "job_name": f"n-{job_id}", "submitted_at": submitted_at, "cluster": cluster}
    assert api.post("/api/jobs", json=body).status_code == 201


# Captures.
MiB = 1024 * 1024
OCTET = {"Content-Type": "application/octet-stream"}


def send(api: LiveServer, job_id: str, file: str, offset: int, total: int, data: bytes | Iterator[bytes] = b"", *,
         cluster: str | None = None, token: str | bool | None = True) -> requests.Response:
    """POST one capture chunk."""
    params: dict[str, Any] = {"file": file, "offset": offset, "total": total,
                              **({"cluster": cluster} if cluster else {})}
    return api.post(f"/api/jobs/{job_id}/captures", params=params, data=data, headers=dict(OCTET), token=token)


def accepted(api: LiveServer, job_id: str, file: str, offset: int, total: int, data: bytes,
             **kwargs: Any) -> dict[str, Any]:
    """Upload one chunk that must be accepted, and check the answer the reporter expects."""
    response = send(api, job_id, file, offset, total, data, **kwargs)
    assert response.status_code == 200, response.text
    assert response.json() == {"job_id": job_id, "next_offset": offset + len(data),
                               "complete": offset + len(data) == total}
    return response.json()


# Logs.
def log_files(api: LiveServer, job_id: str) -> dict[str, tuple[int, bool]]:
    """The job's streamed files: name to (size, final); empty while nothing has arrived."""
    response = api.get(f"/api/jobs/{job_id}/logs")
    if response.status_code == 404:
        return {}
    return {f["file"]: (f["size"], f["final"]) for f in response.json()["files"]}


# A collector that stops and starts again on the same port (readers and the dashboard resume).
class Restartable:
    """gunicorn (one worker) on ``database_url``, on a port kept across ``restart()``; writes with ``token``."""

    def __init__(self, database_url: str, token: str) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url, self.token = f"http://127.0.0.1:{self.port}", token
        self._env = child_env(COLLECTOR_DATABASE_URL=database_url, COLLECTOR_PORT=str(self.port),
                              COLLECTOR_WORKERS="1", SRTCTL_STATUS_TOKEN=token)
        self.server = self._start()

    def _start(self) -> ServerProcess:
        return ServerProcess([sys.executable, "-m", "gunicorn", "-c", "deploy/gunicorn.conf.py",
                              "collector.wsgi:app"], self._env)

    def restart(self) -> None:
        """Stop the server (SIGTERM) and start it again on the same port."""
        self.server.stop()
        self.start()

    def start(self) -> None:
        """Start the server again on the same port (after ``stop()``)."""
        self.server = self._start()

    def stop(self) -> None:
        self.server.stop()

    def write(self, job_id: str, status: str) -> None:
        """PUT ``status`` for ``job_id`` on cluster b200; it must be accepted."""
        body = {"status": status, "updated_at": "2026-12-03T09:00:00Z", "metadata": {"cluster": "b200"}}
        assert requests.put(f"{self.url}/api/jobs/{job_id}", json=body, timeout=10,
                            headers={"Authorization": f"Bearer {self.token}"}).status_code == 200
