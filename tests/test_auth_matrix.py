"""Every documented route under every kind of credential: who gets 401, who 403, who the route's answer.

The routes come from the OpenAPI document, so a new route is in the matrix the moment it
is served, and fails here until it has a recipe below. What each cell must answer is
worked out from the rules (``expected``), never listed by hand.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import http.client
import json
import stat
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from werkzeug.serving import make_server

from collector import credentials
from collector import guard
from collector.app import create_app
from collector.openapi import document
from collector.settings import Settings
from tests.helpers import LiveServer
from tests.helpers import raw_exchange
from tests.helpers import stop_app

OWN = "mx-own"  # the cluster every recipe writes to
OTHER = "mx-other"  # the only cluster of the credential that may not write there
SEED = "mx-seed"  # the job the reads read; written once, never changed
LOG = "run.out"
SEGMENT = "out-0.parquet"
READ_METHODS = frozenset({"GET", "HEAD"})
# The spec's tokens, chosen at import: the routes are read at collection from a document
# built with the settings the module's server gets.
ENV_WRITE = "w-" + uuid.uuid4().hex
ENV_READ = "r-" + uuid.uuid4().hex


@dataclasses.dataclass(frozen=True)
class Who:
    """One column of the matrix: a credential (or none) and what it is."""

    key: str
    name: str | None  # the credential's name, as events and the access log record it
    role: credentials.Role | None  # None: no token at all
    clusters: tuple[str, ...] = ()
    env: bool = False  # one of the spec's environment tokens rather than a tokens-file entry


WHO = [
    Who("none", None, None),
    Who("file-read", "matrix-read", "read"),
    Who("write-own", "matrix-own", "write", (OWN,)),
    Who("write-other", "matrix-other", "write", (OTHER,)),
    Who("file-admin", "matrix-admin", "admin"),
    Who("env-write", credentials.ENV_WRITE, "admin", env=True),
    Who("env-read", credentials.ENV_READ, "read", env=True),
]


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How to make one request of a route, and what it answers when allowed.

    ``job``: "seed" reads the module's job; "fresh" names a new job id per cell (a write
    creates it); "existing" creates a fresh job first (for a DELETE, which removes its own).
    Bodies and queries name cluster ``OWN`` wherever a write can name one.
    """

    status: int
    job: str | None = None
    query: dict[str, Any] = dataclasses.field(default_factory=dict)
    json: Any = None
    data: bytes | None = None
    stream: bool = False
    records_event: bool = False  # a success writes an event carrying the credential's name
    admin_only: bool = False  # reads included: only an admin credential (or the spec's write token) may
    webhook: bool = False  # the path names a webhook, created first (for a DELETE, which removes its own)


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


OCTET = "application/octet-stream"
PAGE = Recipe(200)
RECIPES: dict[tuple[str, str], Recipe] = {
    # The page and its files, open (the guard's list of them: tests/test_ui.py checks it is the page's).
    **{(path, "GET"): PAGE for path in sorted(guard.PAGE_PATHS)},
    # Probes, the description, the metrics.
    ("/api/health", "GET"): Recipe(200),
    ("/api/ready", "GET"): Recipe(200),
    ("/api/openapi.json", "GET"): Recipe(200),
    ("/metrics", "GET"): Recipe(200),
    # Jobs.
    ("/api/jobs", "GET"): Recipe(200, query={"cluster": OWN}),
    ("/api/jobs", "POST"): Recipe(201, job="fresh", records_event=True, json={
        "job_id": "{job_id}", "job_name": "matrix", "submitted_at": "2025-01-26T10:30:00Z", "cluster": OWN}),
    ("/api/jobs/{job_id}", "GET"): Recipe(200, job="seed", query={"cluster": OWN}),
    ("/api/jobs/{job_id}", "PUT"): Recipe(200, job="fresh", records_event=True, json={
        "status": "starting", "updated_at": "2025-01-26T10:35:00Z", "metadata": {"cluster": OWN}}),
    ("/api/jobs/{job_id}", "DELETE"): Recipe(200, job="existing", query={"cluster": OWN}),
    ("/api/jobs/{job_id}/events", "GET"): Recipe(200, job="seed", query={"cluster": OWN}),
    ("/api/jobs/{job_id}/events/stream", "GET"): Recipe(200, job="seed", query={"cluster": OWN}, stream=True),
    ("/api/jobs/{job_id}/logs", "GET"): Recipe(200, job="seed", query={"cluster": OWN, "file": LOG}),
    ("/api/jobs/{job_id}/logs", "POST"): Recipe(200, job="fresh", records_event=True, data=b"line\n",
                                                query={"cluster": OWN, "file": LOG, "offset": 0}),
    ("/api/jobs/{job_id}/captures", "GET"): Recipe(200, job="seed", query={"cluster": OWN}),
    ("/api/jobs/{job_id}/deliveries", "GET"): Recipe(200, job="seed", query={"cluster": OWN}),
    ("/api/jobs/{job_id}/captures", "POST"): Recipe(200, job="fresh", records_event=True, data=b"PAR1",
                                                    query={"cluster": OWN, "file": SEGMENT, "offset": 0, "total": 4}),
    # Events and clusters.
    ("/api/events", "GET"): Recipe(200, query={"cluster": OWN}),
    ("/api/events/stream", "GET"): Recipe(200, query={"cluster": OWN}, stream=True),
    ("/api/clusters", "GET"): Recipe(200),
    ("/api/clusters/stream", "GET"): Recipe(200, stream=True),
    ("/api/clusters/{cluster}/status", "GET"): Recipe(200),
    ("/api/clusters/{cluster}/status", "PUT"): Recipe(200, json={"probed_at": "{now}"}),
    # Webhooks: the URLs the collector will call, chosen and seen by admins alone.
    ("/api/webhooks", "GET"): Recipe(200, admin_only=True),
    ("/api/webhooks", "POST"): Recipe(201, admin_only=True, json={"url": "https://hooks.example/matrix"}),
    ("/api/webhooks/{webhook_id}", "DELETE"): Recipe(200, admin_only=True, webhook=True),
}


def matrix_settings(database_url: str = "sqlite://", tokens_file: Path | None = None) -> Settings:
    """The matrix's configuration: both spec tokens, a tokens file, /metrics as it defaults to.

    Building an app does not read the tokens file, so the collection-time document needs none.
    """
    return Settings(database_url=database_url, write_token=ENV_WRITE, read_token=ENV_READ,
                    tokens_file=tokens_file or Path("/nonexistent/tokens.json"), stream_heartbeat_s=0.2)


def operations(built: dict[str, Any]) -> dict[tuple[str, str], bool]:
    """Every (path, METHOD) of an OpenAPI document, and whether it is open (``security: []``)."""
    return {(path, method.upper()): operation.get("security") == []
            for path, item in built["paths"].items() for method, operation in item.items()}


def documented() -> dict[tuple[str, str], bool]:
    """The routes of the document the matrix's server serves, each GET's HEAD beside it."""
    found = operations(document(create_app(matrix_settings())))
    # Flask answers HEAD wherever it answers GET (the document leaves it out): a read like GET.
    return found | {(path, "HEAD"): is_open for (path, method), is_open in found.items() if method == "GET"}


def recipe_key(path: str, method: str) -> tuple[str, str]:
    """A HEAD is made as its GET is."""
    return (path, "GET" if method == "HEAD" else method)


DOCUMENTED = documented()
ROUTES = sorted(DOCUMENTED.keys() | RECIPES.keys())


def expected(path: str, method: str, who: Who) -> tuple[int, str]:
    """The status a cell must answer (the recipe's on success) and why, from the rules alone."""
    success = RECIPES[recipe_key(path, method)].status
    if DOCUMENTED[(path, method)]:
        return success, "open route"
    if who.role is None:
        return 401, "no token"
    if RECIPES[recipe_key(path, method)].admin_only:
        return (success, "admin manages webhooks") if who.role == "admin" else (403, "webhooks need admin")
    if method in READ_METHODS:
        return success, "any credential reads"
    if who.role == "read":
        return 403, "read role"
    if method == "DELETE":
        return (success, "admin deletes") if who.role == "admin" else (403, "DELETE needs admin")
    if who.clusters and OWN not in who.clusters:
        return 403, "out of scope"
    return success, "writes"


# -- the server ---------------------------------------------------------------------------


@dataclasses.dataclass
class Matrix:
    """The module's server and the secret of every column."""

    server: LiveServer
    secrets: dict[str, str | None]


@pytest.fixture(scope="module")
def matrix(database, tmp_path_factory) -> Iterator[Matrix]:
    """One collector for the whole module: spec tokens, and a tokens file of read, scoped write and admin."""
    tokens = tmp_path_factory.mktemp("auth-matrix") / "tokens.json"
    secrets: dict[str, str | None] = {"none": None, "env-write": ENV_WRITE, "env-read": ENV_READ}
    for who in WHO:
        if who.role is not None and not who.env:
            assert who.name is not None
            secrets[who.key] = credentials.add(tokens, who.name, who.role, who.clusters)
    tokens.chmod(0o600)
    assert stat.S_IMODE(tokens.stat().st_mode) == 0o600
    settings = matrix_settings(database.url, tokens)
    app = create_app(settings)
    httpd = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    server = LiveServer(url=f"http://127.0.0.1:{httpd.server_port}", settings=settings, token=ENV_WRITE, app=app)
    try:
        _seed(server)
        yield Matrix(server, secrets)
    finally:
        app.extensions["collector.streams"].close()  # ends open streams, so shutdown does not wait on them
        httpd.shutdown()
        thread.join(timeout=10)
        httpd.server_close()
        stop_app(app)


def _seed(server: LiveServer) -> None:
    """The job every read reads: a log file and a complete capture segment on cluster OWN."""
    submit = {"job_id": SEED, "job_name": "seed", "submitted_at": "2025-01-26T10:30:00Z", "cluster": OWN}
    assert server.post("/api/jobs", json=submit).status_code == 201
    octet = {"Content-Type": OCTET}
    assert server.post(f"/api/jobs/{SEED}/logs", params={"cluster": OWN, "file": LOG, "offset": 0},
                       data=b"hello\n", headers=dict(octet)).status_code == 200
    assert server.post(f"/api/jobs/{SEED}/captures", params={"cluster": OWN, "file": SEGMENT, "offset": 0,
                                                             "total": 4},
                       data=b"PAR1", headers=dict(octet)).status_code == 200


def _create(server: LiveServer, job_id: str) -> None:
    submit = {"job_id": job_id, "job_name": "matrix", "submitted_at": "2025-01-26T10:30:00Z", "cluster": OWN}
    assert server.post("/api/jobs", json=submit).status_code == 201


def _fill(value: Any, job_id: str | None) -> Any:
    """The recipe's body with this cell's job id and the present time put in."""
    if isinstance(value, dict):
        return {key: _fill(item, job_id) for key, item in value.items()}
    if value == "{job_id}":
        return job_id
    if value == "{now}":
        return _now()
    return value


def _job_exists(server: LiveServer, job_id: str) -> bool:
    status = server.get(f"/api/jobs/{job_id}", params={"cluster": OWN}).status_code
    assert status in (200, 404)
    return status == 200


# -- the matrix --------------------------------------------------------------------------


@pytest.mark.parametrize("who", WHO, ids=[who.key for who in WHO])
@pytest.mark.parametrize(("path", "method"), ROUTES, ids=[f"{method}:{path}" for path, method in ROUTES])
def test_cell(matrix: Matrix, path: str, method: str, who: Who) -> None:
    if (path, method) not in DOCUMENTED:
        pytest.fail(f"route {method} {path} is in the auth matrix but not in the OpenAPI document: remove its case")
    if recipe_key(path, method) not in RECIPES:
        pytest.fail(f"route {method} {path} has no case in the auth matrix: add one")
    recipe = RECIPES[recipe_key(path, method)]
    head = method == "HEAD"
    server = matrix.server
    status, why = expected(path, method, who)

    job_id = {"seed": SEED, "fresh": f"mx-{uuid.uuid4().hex[:16]}", "existing": f"mx-{uuid.uuid4().hex[:16]}",
              None: None}[recipe.job]
    if recipe.job == "existing":
        assert job_id is not None
        _create(server, job_id)
    webhook_id = server.post("/api/webhooks", json={"url": "https://hooks.example/delete-me"}).json()["id"] \
        if recipe.webhook else None
    url = server.url + path.replace("{job_id}", job_id or "").replace("{cluster}", OWN) \
        .replace("{webhook_id}", str(webhook_id))
    headers = {"Authorization": f"Bearer {secret}"} if (secret := matrix.secrets[who.key]) else {}
    kwargs: dict[str, Any] = {"params": recipe.query, "headers": headers, "allow_redirects": False}
    if recipe.json is not None:
        kwargs["json"] = _fill(recipe.json, job_id)
    if recipe.data is not None:
        kwargs["data"] = recipe.data
        headers["Content-Type"] = OCTET

    streams = recipe.stream and not head
    with requests.request(method, url, stream=streams, timeout=(5, 5) if streams else 10, **kwargs) as response:
        cell = f"{method} {path} as {who.key} ({why})"
        if head:
            assert response.content == b"", cell
            answer = None
        elif streams and response.status_code == 200:
            assert response.headers["Content-Type"].startswith("text/event-stream"), cell
            assert next(response.iter_content(chunk_size=None)), cell  # the stream began; closed on leaving
            answer = None
        else:
            is_json = response.headers.get("Content-Type", "").startswith("application/json")
            answer = response.json() if is_json else None
        assert response.status_code == status, f"{cell}: {response.status_code} {response.text[:300]}"

    if status == 401:
        assert response.headers["WWW-Authenticate"] == "Bearer", cell
        assert head or answer is not None and answer["detail"] == "missing bearer token", cell
    elif status == 403 and head:
        pass  # no body to read: the status says it
    elif status == 403:
        assert answer is not None, cell
        if why == "out of scope":
            assert answer["clusters"] == list(who.clusters), cell
            assert OTHER in answer["detail"] and OWN in answer["detail"], cell
        else:
            assert "clusters" not in answer, cell
            # The guard's refusal names the credential (the spec's read token by what it is).
            assert ("the read token" if who.name == credentials.ENV_READ else repr(who.name)) in answer["detail"], cell
    else:
        assert status not in (401, 403)
        if isinstance(answer, dict) and "cluster" in answer:
            assert answer["cluster"] == OWN, cell

    # The refused change left nothing behind; the allowed one is recorded under its writer.
    if webhook_id is not None:
        kept = [hook["id"] for hook in server.get("/api/webhooks").json()["webhooks"]]
        assert (webhook_id in kept) is (status != 200), cell
    if job_id is not None and recipe.job != "seed":
        if method == "DELETE":
            assert _job_exists(server, job_id) is (status != 200), cell
        elif status in (401, 403):
            assert not _job_exists(server, job_id), cell
        elif recipe.records_event:
            events = server.get(f"/api/jobs/{job_id}", params={"cluster": OWN}).json()["events"]
            assert events and {event["credential"] for event in events} == {who.name}, cell


def test_every_documented_route_has_a_recipe_and_every_recipe_a_route():
    missing = sorted({recipe_key(path, method) for path, method in DOCUMENTED} - RECIPES.keys())
    assert not missing, "\n".join(f"route {method} {path} has no case in the auth matrix: add one"
                                  for path, method in missing)
    stale = sorted(RECIPES.keys() - DOCUMENTED.keys())
    assert not stale, "\n".join(f"route {method} {path} is in the auth matrix but not in the OpenAPI document: "
                                "remove its case" for path, method in stale)


def test_the_matrix_covers_what_the_server_serves(matrix: Matrix):
    # The routes were read from a document built at collection; the server's must be the same.
    served = operations(requests.get(matrix.server.url + "/api/openapi.json", timeout=10).json())
    assert served == {route: is_open for route, is_open in DOCUMENTED.items() if route[1] != "HEAD"}
    assert DOCUMENTED[("/metrics", "GET")] is False  # tokens configured: /metrics needs one by default
    assert {who.key for who in WHO} == set(matrix.secrets)


# -- the check comes before the body -----------------------------------------------------


def _declared_only(server: LiveServer, method: str, path: str, length: int, first: bytes,
                   token: str | None = None) -> tuple[int, dict[str, Any], dict[str, str]]:
    """Declare a ``length``-byte body, send only ``first``: the answer must not wait for the rest."""
    host, port = server.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.putrequest(method, path)
        connection.putheader("Content-Type", "application/json")
        connection.putheader("Content-Length", str(length))
        if token:
            connection.putheader("Authorization", f"Bearer {token}")
        connection.endheaders(first)
        response = connection.getresponse()
        return response.status, json.loads(response.read()), dict(response.getheaders())
    finally:
        connection.close()


def test_no_token_is_401_before_the_body_is_looked_at(matrix: Matrix):
    server = matrix.server
    over = server.settings.max_body_bytes + 1
    status, answer, headers = _declared_only(server, "POST", "/api/jobs", over, b"{")
    assert (status, answer["detail"], headers["WWW-Authenticate"]) == (401, "missing bearer token", "Bearer")
    status, answer, _ = _declared_only(server, "POST", "/api/jobs", over, b"{", token="wrong")
    assert (status, answer["detail"]) == (401, "invalid bearer token")
    # A whole body that is not JSON: still 401, never the 400 a parse would give.
    response = requests.post(server.url + "/api/jobs", data=b"{not json", timeout=10,
                             headers={"Content-Type": "application/json"})
    assert (response.status_code, response.headers["WWW-Authenticate"]) == (401, "Bearer")


@pytest.mark.parametrize("key", ["file-read", "env-read"])
def test_read_role_is_403_before_the_body_is_looked_at(matrix: Matrix, key: str):
    server = matrix.server
    secret = matrix.secrets[key]
    assert secret is not None
    writes = [("POST", "/api/jobs"), ("PUT", "/api/jobs/mx-badbody"), ("PUT", f"/api/clusters/{OWN}/status")]
    for method, path in writes:
        response = requests.request(method, server.url + path, data=b"{not json", timeout=10,
                                    headers={"Content-Type": "application/json", "Authorization": f"Bearer {secret}"})
        assert response.status_code == 403, (method, path, response.text)
    # Oversize: the role is refused before the length is.
    status, answer, _ = _declared_only(server, "POST", "/api/jobs", server.settings.max_body_bytes + 1, b"{",
                                       token=secret)
    assert status == 403 and "clusters" not in answer
    assert not _job_exists(server, "mx-badbody")


def test_scope_from_the_path_or_query_is_403_before_the_body_is_read(matrix: Matrix):
    # Where the cluster is in the URL, a credential of another cluster never gets to the body.
    server = matrix.server
    other = LiveServer(url=server.url, settings=server.settings, token=matrix.secrets["write-other"])
    reply = raw_exchange(other, f"PUT /api/clusters/{OWN}/status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                                "Content-Type: application/json\r\nContent-Length: 9\r\n".encode(), b"{not json")
    assert reply.startswith("HTTP/1.1 403"), reply
    assert f'"clusters":["{OTHER}"]' in reply.replace(" ", "")
    # A chunk no segment could take (it starts past the segment's end): refused for its cluster first.
    chunk: dict[str, Any] = {"cluster": OWN, "file": SEGMENT, "offset": 5, "total": 3}
    response = requests.post(f"{server.url}/api/jobs/mx-badbody/captures", data=b"x" * 10, timeout=10,
                             params=chunk, headers={"Content-Type": OCTET, "Authorization": f"Bearer {other.token}"})
    assert (response.status_code, response.json()["clusters"]) == (403, [OTHER])
    assert not _job_exists(server, "mx-badbody")
