"""Auth, body limits, CORS and request ids: everything that runs before routing."""

from __future__ import annotations

import pytest

from tests.helpers import raw_exchange

SUBMIT = {"job_id": "1", "job_name": "n", "submitted_at": "2025-01-26T10:30:00Z"}
WRITES = [("POST", "/api/jobs"), ("PUT", "/api/jobs/1"), ("DELETE", "/api/jobs/1")]
READS = [("GET", "/api/jobs"), ("GET", "/api/jobs/1"), ("GET", "/api/events"), ("GET", "/api/jobs/1/events"),
         ("GET", "/api/nowhere"), ("HEAD", "/api/jobs")]


@pytest.mark.parametrize("method, path", WRITES + READS)
@pytest.mark.parametrize("token", [None, "wrong"])
def test_missing_or_wrong_token_is_401_and_says_nothing_else(api, method, path, token):
    response = api.request(method, path, token=token, data=b"{not json")
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == "Bearer"
    if method != "HEAD":
        assert response.json() == {
            "detail": "missing bearer token" if token is None else "invalid bearer token",
            "request_id": response.headers["X-Request-ID"],
        }


def test_token_scheme_must_be_bearer(api):
    response = api.get("/api/jobs", token=False, headers={"Authorization": f"Basic {api.token}"})
    assert response.status_code == 401


@pytest.mark.parametrize("method, path", WRITES)
def test_read_token_cannot_write(api, database, method, path):
    response = api.request(method, path, token=api.settings.read_token, json=SUBMIT)
    assert response.status_code == 403
    assert "read token" in response.json()["detail"]
    assert database.scalar("SELECT count(*) FROM jobs") == 0


def test_read_token_reads_and_write_token_does_everything(api):
    assert api.post("/api/jobs", json=SUBMIT).status_code == 201
    assert api.get("/api/jobs/1", token=api.settings.read_token).status_code == 200
    assert api.get("/api/jobs/1").status_code == 200


@pytest.mark.parametrize("path", ["/api/health", "/api/ready", "/", "/index.html"])
def test_open_routes_need_no_token(api, path):
    response = api.get(path, token=None)
    assert response.status_code == 200
    head = api.request("HEAD", path, token=None)
    assert head.status_code == 200 and head.content == b""
    assert head.headers["Content-Type"] == response.headers["Content-Type"]


def test_health_says_only_ok(api):
    assert api.get("/api/health", token=None).json() == {"status": "ok"}


def test_page_is_html(api):
    response = api.get("/", token=None)
    assert response.headers["Content-Type"].startswith("text/html")
    assert "<html" in response.text


def test_no_write_token_means_open_on_loopback(serve):
    open_server = serve()
    assert open_server.post("/api/jobs", json=SUBMIT).status_code == 201


def test_oversize_body_is_413_before_it_is_read(api, database):
    # Declare 2 MiB but send none of it: the answer must come without waiting for the body.
    reply = raw_exchange(api, b"PUT /api/jobs/1 HTTP/1.1\r\nHost: x\r\nContent-Length: 2097152\r\n")
    assert reply.startswith("HTTP/1.1 413")
    assert "exceeds the 1048576-byte limit" in reply
    assert database.scalar("SELECT count(*) FROM jobs") == 0


def test_oversize_body_without_token_is_401_not_413(api):
    response = api.put("/api/jobs/1", token=None, data=b"x" * (1024 * 1024 + 1))
    assert response.status_code == 401


def test_body_at_the_limit_is_parsed(api):
    body = b'{"status": "workers", "updated_at": "2025-01-26T10:35:00Z", "message": "'
    body += b"m" * (1024 * 1024 - len(body) - 2) + b'"}'
    assert len(body) == 1024 * 1024
    response = api.put("/api/jobs/1", data=body)
    # The message is longer than a message may be: a 422 that says so, never a 413 or 500.
    assert response.status_code == 422
    assert "message" in response.json()["detail"]


def test_body_shorter_than_content_length_is_400_and_stores_nothing(api, database):
    body = b'{"status": "workers", "updated_at": "2025-01-26T10:35:00Z"}'
    head = b"PUT /api/jobs/1 HTTP/1.1\r\nHost: x\r\nContent-Length: " + str(len(body) + 50).encode() + b"\r\n"
    text = raw_exchange(api, head, body, half_close=True)
    assert text.startswith("HTTP/1.1 400"), text
    assert "body ended before its Content-Length" in text
    assert database.scalar("SELECT count(*) FROM jobs") == 0


# ---------------------------------------------------------------- CORS


@pytest.fixture
def cors(serve):
    return serve(write_token="w", read_token="r", cors_origins=("https://zhongshan.example",))


def test_preflight_is_answered_before_auth(cors):
    response = cors.request("OPTIONS", "/api/jobs", token=None, headers={
        "Origin": "https://zhongshan.example", "Access-Control-Request-Method": "GET",
        "Access-Control-Request-Headers": "authorization"})
    assert response.status_code == 204
    assert response.headers["Access-Control-Allow-Origin"] == "https://zhongshan.example"
    assert response.headers["Access-Control-Allow-Methods"] == "GET, HEAD, OPTIONS"
    assert response.headers["Access-Control-Allow-Headers"] == "Authorization, Last-Event-ID"


def test_preflight_from_unlisted_origin_gets_no_grant(cors):
    response = cors.request("OPTIONS", "/api/jobs", token=None, headers={
        "Origin": "https://evil.example", "Access-Control-Request-Method": "GET"})
    assert "Access-Control-Allow-Origin" not in response.headers


def test_cors_on_reads_including_errors(cors):
    origin = {"Origin": "https://zhongshan.example"}
    ok = cors.get("/api/jobs", token="r", headers=dict(origin))
    assert ok.status_code == 200
    assert ok.headers["Access-Control-Allow-Origin"] == "https://zhongshan.example"
    assert "Origin" in ok.headers["Vary"]
    denied = cors.get("/api/jobs", token=None, headers=dict(origin))
    assert denied.status_code == 401
    assert denied.headers["Access-Control-Allow-Origin"] == "https://zhongshan.example"
    other = cors.get("/api/jobs", token="r", headers={"Origin": "https://evil.example"})
    assert "Access-Control-Allow-Origin" not in other.headers


def test_writes_are_never_offered_cross_origin(cors):
    response = cors.post("/api/jobs", token="w", json=SUBMIT, headers={"Origin": "https://zhongshan.example"})
    assert response.status_code == 201
    assert "Access-Control-Allow-Origin" not in response.headers


def test_cors_star_allows_any_origin(serve):
    server = serve(write_token="w", cors_origins=("*",))
    response = server.get("/api/health", headers={"Origin": "null"})
    assert response.headers["Access-Control-Allow-Origin"] == "*"


def test_no_cors_by_default(api):
    response = api.get("/api/jobs", headers={"Origin": "https://zhongshan.example"})
    assert "Access-Control-Allow-Origin" not in response.headers


# ---------------------------------------------------------------- request ids


def test_every_response_has_a_request_id_and_errors_repeat_it(api, caplog):
    caplog.set_level("INFO", logger="collector.access")
    ok = api.get("/api/health")
    error = api.get("/api/jobs/missing")
    assert len(ok.headers["X-Request-ID"]) == 32
    assert error.json()["request_id"] == error.headers["X-Request-ID"] != ok.headers["X-Request-ID"]
    lines = [r.getMessage() for r in caplog.records if r.name == "collector.access"]
    assert any(error.headers["X-Request-ID"] in line and " 404 " in line for line in lines)


def test_sane_incoming_request_id_is_kept_and_hostile_one_replaced(api):
    kept = api.get("/api/jobs/x", headers={"X-Request-ID": "lb-1234.abc"})
    assert kept.headers["X-Request-ID"] == "lb-1234.abc" == kept.json()["request_id"]
    replaced = api.get("/api/jobs/x", headers={"X-Request-ID": "bad id\tinjected"})
    assert replaced.headers["X-Request-ID"] != "bad id\tinjected"


def test_tokens_are_never_logged(api, caplog):
    caplog.set_level("DEBUG")
    api.get("/api/jobs")
    api.get("/api/jobs", token="guess-" + api.token)
    assert api.token not in caplog.text


def chunks(total: int):
    yield b'{"status": "workers", "updated_at": "2025-01-26T10:35:00Z", "message": "'
    for _ in range(total // 65536):
        yield b"m" * 65536
    yield b'"}'


def test_chunked_body_over_the_limit_is_413(api, database):
    response = api.put("/api/jobs/1", data=chunks(2 * 1024 * 1024))
    assert response.status_code == 413
    assert response.json()["detail"] == "chunked body exceeds the 1048576-byte limit"
    assert database.scalar("SELECT count(*) FROM jobs") == 0


def test_small_chunked_body_is_read_whole(api):
    def body():
        yield b'{"status": "workers", '
        yield b'"updated_at": "2025-01-26T10:35:00Z"}'

    assert api.put("/api/jobs/1", data=body()).status_code == 200


def test_request_without_length_or_body_is_answered_not_left_hanging(api):
    reply = raw_exchange(api, b"PUT /api/jobs/1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n")
    assert reply.startswith("HTTP/1.1 400")
    assert "body is not valid JSON" in reply
