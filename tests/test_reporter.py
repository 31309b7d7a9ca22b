"""collector.reporter: the transport's rules and StatusReporter's srtctl semantics, against live collectors."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time

from collector.contract import JobStage
from collector.contract import JobStatus
from collector.reporter.status import STAGES
from collector.reporter.status import STATUSES
from collector.reporter.status import StatusReporter
from collector.reporter.transport import Outcome
from collector.reporter.transport import Transport
from collector.reporter.transport import env_endpoints
from collector.reporter.transport import env_token
from tests.helpers import DROP
from tests.helpers import HANG
from tests.helpers import closed_port_url
from tests.helpers import detail
from tests.helpers import new_id


def events(api, job_id) -> list[tuple]:
    body = api.get(f"/api/jobs/{job_id}/events").json()
    return [(e["status"], e["stage"], e["message"]) for e in body["events"]]


def logged(caplog) -> list[tuple[int, str]]:
    """What the reporter logged: (level, message)."""
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "collector.reporter"]


def test_the_package_imports_neither_flask_nor_sqlalchemy():
    # What a batch job (or srtctl) importing only the reporter pulls in.
    code = (
        "import sys\n"
        "import collector.reporter.cli, collector.reporter.streamer, collector.reporter.status\n"
        "print(sorted(m for m in ('flask', 'sqlalchemy', 'werkzeug', 'pydantic', 'alembic') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30,
                         cwd=os.path.dirname(os.path.dirname(__file__)))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_whole_lifecycle_lands_with_srtctl_semantics(api):
    job_id = new_id("r")
    reporter = StatusReporter(Transport([api.url], api.token), job_id, cluster="b200")
    assert reporter.create("sweep-1", recipe="recipes/a.yaml", metadata={"tags": ["suite:x"]}) is True
    assert reporter.create("sweep-1") is True  # a repeat is 201 too
    assert reporter.report_started(job_name="sweep-1", head_node="node-07", log_dir="/lustre/logs/1") is True
    assert reporter.report("workers", "workers", "Starting workers") is True
    assert reporter.report_completed(0, logs_url="s3://bucket/1/") is True
    job = detail(api, job_id)
    assert (job["status"], job["stage"], job["message"], job["exit_code"]) == (
        "completed", "cleanup", "Benchmark completed successfully", 0)
    assert (job["job_name"], job["cluster"], job["recipe"], job["logs_url"]) == (
        "sweep-1", "b200", "recipes/a.yaml", "s3://bucket/1/")
    assert job["started_at"] and job["completed_at"]
    assert {k: job["metadata"][k] for k in ("job_name", "cluster", "head_node", "log_dir", "tags")} == {
        "job_name": "sweep-1", "cluster": "b200", "head_node": "node-07", "log_dir": "/lustre/logs/1",
        "tags": ["suite:x"]}
    assert events(api, job_id) == [
        ("submitted", None, None),
        ("starting", "starting", "Job started on node-07"),
        ("workers", "workers", "Starting workers"),
        ("completed", "cleanup", "Benchmark completed successfully"),
    ]


def test_a_nonzero_exit_code_reports_failed(api):
    job_id = new_id("r")
    reporter = StatusReporter(Transport([api.url], api.token), job_id)
    assert reporter.report_completed(3) is True
    job = detail(api, job_id)
    assert (job["status"], job["stage"], job["message"], job["exit_code"]) == (
        "failed", "cleanup", "Job failed with exit code 3", 3)


def test_wire_format_exclude_none_unquoted_id_bearer_and_exact_success_codes(recorder, api):
    wire = recorder(api.url)
    reporter = StatusReporter(Transport([wire.url], api.token), "12345_1", cluster="c1")
    assert reporter.create("n") is True
    assert reporter.report("benchmark", message=None, exit_code=None, metadata={"k": None}) is True
    post, put = wire.requests
    assert (post.method, post.path, post.answer[0]) == ("POST", "/api/jobs", 201)
    assert set(json.loads(post.body)) == {"job_id", "job_name", "submitted_at", "cluster"}
    assert json.loads(post.body)["submitted_at"].endswith("Z")
    assert (put.method, put.path, put.answer[0]) == ("PUT", "/api/jobs/12345_1", 200)
    body = json.loads(put.body)
    # Top-level nulls left out; nulls nested in metadata sent; the cluster repeated in metadata.
    assert set(body) == {"status", "updated_at", "metadata"}
    assert body["metadata"] == {"cluster": "c1", "k": None}
    assert post.headers["Authorization"] == put.headers["Authorization"] == f"Bearer {api.token}"
    # 200 to a POST or 201 to a PUT is not success.
    wrong = recorder(script=lambda request, _: (200 if request.method == "POST" else 201, {}, b"{}"))
    reporter = StatusReporter(Transport([wrong.url], None), "1")
    assert reporter.create("n") is False
    assert reporter.report("starting") is False
    assert all("Authorization" not in r.headers for r in wrong.requests)


def test_redirects_are_not_followed_and_warned(recorder, api, caplog):
    job_id = new_id("r")
    target = f"{api.url}/api/jobs/{job_id}"
    redirect = recorder(script=lambda *_: (307, {"Location": target}, b""))
    with caplog.at_level(logging.DEBUG, logger="collector.reporter"):
        outcomes = Transport([redirect.url], api.token).send("PUT", f"/api/jobs/{job_id}", json={
            "status": "starting", "updated_at": "2026-12-03T10:00:00Z"})
    assert outcomes == [Outcome(redirect.url, 307, None, False, f"HTTP 307 redirect to {target} (not followed)")]
    assert len(redirect.requests) == 1  # not retried either
    assert api.get(f"/api/jobs/{job_id}").status_code == 404  # nothing reached the collector
    (level, message), = logged(caplog)
    assert level == logging.WARNING and "not followed" in message


def test_401_and_403_are_warned_other_failures_only_at_debug(api, caplog):
    payload = {"status": "starting", "updated_at": "2026-12-03T10:00:00Z"}
    with caplog.at_level(logging.DEBUG, logger="collector.reporter"):
        missing = Transport([api.url], None).send("PUT", "/api/jobs/1", json=payload)
        wrong = Transport([api.url], api.settings.read_token).send("PUT", "/api/jobs/1", json=payload)
        invalid = Transport([api.url], api.token).send("PUT", "/api/jobs/1", json={"status": "bogus"})
    assert [(o.status, o.ok) for o in missing + wrong + invalid] == [(401, False), (403, False), (422, False)]
    assert [(level, "check the token" in message) for level, message in logged(caplog)] == [
        (logging.WARNING, True), (logging.WARNING, True), (logging.DEBUG, False)]


def test_network_errors_get_two_attempts_http_errors_one(recorder, api):
    job_id = new_id("r")
    attempts = []

    def drop_first(request, wire):
        attempts.append(request)
        return DROP if len(attempts) == 1 else None

    flaky = recorder(api.url, drop_first)
    outcome, = Transport([flaky.url], api.token).send("PUT", f"/api/jobs/{job_id}", json={
        "status": "starting", "updated_at": "2026-12-03T10:00:00Z"})
    assert outcome.body is not None
    assert (outcome.status, outcome.ok, outcome.body["job_id"]) == (200, True, job_id)
    assert len(flaky.requests) == 2 and flaky.requests[0].body == flaky.requests[1].body
    assert detail(api, job_id)["status"] == "starting"

    broken = recorder(script=lambda *_: (500, {}, b"oops"))
    outcome, = Transport([broken.url], None).send("GET", "/api/health")
    assert outcome == Outcome(broken.url, 500, None, False, "HTTP 500")
    assert len(broken.requests) == 1

    always = recorder(script=lambda *_: DROP)
    outcome, = Transport([always.url], None).send("GET", "/api/health")
    assert outcome.error is not None
    assert (outcome.status, outcome.ok, outcome.error.startswith("ConnectionError")) == (None, False, True)
    assert len(always.requests) == 2


def test_a_closed_port_fails_fast_and_never_raises():
    url = closed_port_url()
    started = time.monotonic()
    outcome, = Transport([url], None).send("GET", "/api/health")
    assert time.monotonic() - started < 1.0
    assert (outcome.endpoint, outcome.status, outcome.body, outcome.ok) == (url, None, None, False)
    assert "ConnectionError" in (outcome.error or "")
    nonsense, = Transport(["not a url"], None).send("GET", "/api/health")
    assert (nonsense.status, nonsense.ok) == (None, False)
    assert StatusReporter(Transport([], None), "1").report("starting") is False


def test_a_silent_endpoint_costs_timeout_times_attempts(recorder):
    silent = recorder(script=lambda *_: HANG)
    started = time.monotonic()
    outcome, = Transport([silent.url], None, timeout=0.3).send("GET", "/api/health")
    elapsed = time.monotonic() - started
    assert 0.6 <= elapsed < 1.5
    assert outcome.error is not None
    assert (outcome.status, outcome.ok, outcome.error.startswith(("ReadTimeout", "Timeout"))) == (None, False, True)
    assert len(silent.requests) == 2
    # A shorter per-request timeout (the streamer's shutdown deadline) lowers it.
    started = time.monotonic()
    Transport([silent.url], None, timeout=5.0, attempts=1).send("GET", "/api/health", timeout=0.2)
    assert time.monotonic() - started < 0.6


def test_every_endpoint_gets_everything_one_after_another(api, second_api):
    job_id = new_id("r")
    down = closed_port_url()
    transport = Transport([api.url, down, second_api.url], api.token)
    reporter = StatusReporter(transport, job_id, cluster="c")
    assert reporter.report_started(job_name="j", head_node="h") is False  # not every endpoint took it
    assert reporter.report("workers", "workers", "Starting workers") is False
    assert [o.status for o in transport.send("GET", "/api/health")] == [200, None, 200]
    for collector in (api, second_api):
        assert events(collector, job_id) == [("starting", "starting", "Job started on h"),
                                             ("workers", "workers", "Starting workers")]
    assert StatusReporter(Transport([api.url, second_api.url], api.token), job_id).report("benchmark") is True


def test_the_reporters_statuses_and_stages_are_the_contracts():
    assert tuple(s.value for s in JobStatus) == STATUSES
    assert tuple(s.value for s in JobStage) == STAGES


def test_env_helpers(monkeypatch):
    monkeypatch.setenv("COLLECTOR_ENDPOINTS", " http://a:1, ,http://b:2 ")
    monkeypatch.setenv("SRTCTL_STATUS_TOKEN", "t1")
    monkeypatch.setenv("OTHER_TOKEN", "")
    assert env_endpoints(()) == ["http://a:1", "http://b:2"]
    assert env_endpoints(["http://c:3"]) == ["http://c:3"]
    assert (env_token(), env_token("OTHER_TOKEN"), env_token("UNSET_TOKEN_VARIABLE")) == ("t1", None, None)
