"""COLLECTOR_LOG_FORMAT=json: every line of `collector serve` and gunicorn is one JSON object with the request id."""

from __future__ import annotations

import datetime as dt
import getpass
import json
import logging
import sys
import uuid

import pytest
import requests
from sqlalchemy import make_url

from collector import serving
from collector.log_format import JsonFormatter
from collector.log_format import redact_query
from collector.settings import Settings
from collector.settings import SettingsError
from tests.processes import ServerProcess
from tests.processes import child_env
from tests.processes import collector_command
from tests.processes import run

GUNICORN = [sys.executable, "-m", "gunicorn", "-c", "deploy/gunicorn.conf.py", "collector.wsgi:app"]


@pytest.fixture(params=["serve", "gunicorn"])
def json_server(request, database):
    """A collector subprocess logging JSON, with both tokens and (on PostgreSQL) a password in its URL."""
    database.clean()
    write, read = "w-" + uuid.uuid4().hex, "r-" + uuid.uuid4().hex
    url, password = database.url, None
    if database.is_postgres:
        # Peer authentication on the socket ignores the password; it is there to be hidden.
        password = "pw-" + uuid.uuid4().hex
        base = make_url(url)
        # A URL renders a password only after a user name: peer authentication's, this process's.
        url = base.set(username=base.username or getpass.getuser(), password=password).render_as_string(
            hide_password=False)
        assert password in url
    env = child_env(COLLECTOR_LOG_FORMAT="json", COLLECTOR_DATABASE_URL=url, SRTCTL_STATUS_TOKEN=write,
                    SRTCTL_STATUS_READ_TOKEN=read, COLLECTOR_PORT="0", COLLECTOR_WORKERS="1")
    command = collector_command("serve") if request.param == "serve" else GUNICORN
    server = ServerProcess(command, env)
    yield request.param, server, write, read, password
    server.stop()


def _session(server, write: str, read: str) -> dict[str, requests.Response]:
    """The requests every variant makes: good and wrong tokens, a 404, a transition, a token in the URL."""
    headers = {"read": {"Authorization": f"Bearer {read}"}, "write": {"Authorization": f"Bearer {write}"}}
    body = {"status": "starting", "stage": "starting", "message": "Job started on node-01",
            "updated_at": "2025-01-26T10:35:00Z"}
    return {
        "list": requests.get(server.url + "/api/jobs", headers=headers["read"], timeout=5),
        "wrong": requests.get(server.url + "/api/jobs", headers={"Authorization": "Bearer wrong-" + write},
                              timeout=5),
        "missing": requests.get(server.url + "/api/jobs/no-such-job", headers=headers["read"], timeout=5),
        "put": requests.put(server.url + "/api/jobs/logfmt-1", json=body, headers=headers["write"], timeout=5),
        "query": requests.get(server.url + f"/api/jobs?limit=5&token={read}", headers=headers["read"], timeout=5),
    }


def _access(entries: list[dict], response: requests.Response) -> dict:
    [line] = [e for e in entries if e["logger"] == "collector.access"
              and e["request_id"] == response.headers["X-Request-ID"]]
    return line


def test_every_line_is_json_with_request_ids_and_no_secrets(json_server):
    kind, server, write, read, password = json_server
    responses = _session(server, write, read)
    assert [r.status_code for r in responses.values()] == [200, 401, 404, 200, 200], server.output
    server.stop()  # the shutdown lines count too
    output = server.output
    entries = [json.loads(line) for line in output.splitlines()]  # raises on any line that is not JSON

    for entry in entries:
        assert {"ts", "level", "logger", "message", "request_id"} <= entry.keys()
        assert dt.datetime.fromisoformat(entry["ts"].replace("Z", "+00:00")).utcoffset() == dt.timedelta(0)
    put = responses["put"]
    assert _access(entries, put) == {
        **_access(entries, put),
        "level": "INFO", "method": "PUT", "path": "/api/jobs/logfmt-1", "query": None, "status": 200,
        "bytes": len(put.content), "remote": "127.0.0.1", "credential": "env:write",
    }
    assert _access(entries, put)["duration_ms"] >= 0
    # The application line of that PUT carries the same id.
    [transition] = [e for e in entries if e["logger"] == "collector.jobs"]
    assert transition["message"] == "job logfmt-1 -> starting/starting: Job started on node-01"
    assert transition["request_id"] == put.headers["X-Request-ID"]
    assert _access(entries, responses["wrong"])["status"] == 401
    assert _access(entries, responses["wrong"])["credential"] is None  # no credential matched: who is unknown
    assert _access(entries, responses["wrong"])["message"].endswith(" credential=-")
    assert _access(entries, responses["missing"])["status"] == 404
    assert _access(entries, responses["missing"])["path"] == "/api/jobs/no-such-job"
    query = _access(entries, responses["query"])
    assert query["query"] == "limit=5&token=REDACTED"
    assert query["message"].endswith(
        f'"GET /api/jobs?limit=5&token=REDACTED" 200 {query["duration_ms"]:.1f}ms '
        f'request_id={responses["query"].headers["X-Request-ID"]} credential=env:read')
    assert query["credential"] == "env:read"
    # Lines outside a request say so.
    listening = [e for e in entries if "istening" in e["message"]]
    assert listening and all(e["request_id"] is None for e in listening)
    if kind == "serve":
        [startup] = [e for e in entries if e["message"].startswith("collector listening on")]
        assert startup["message"].endswith(", token required)")
        if password:
            assert ":***@" in startup["message"]
    for secret in (write, read, password):
        if secret:
            assert secret not in output


def test_unknown_log_format_is_refused_naming_the_variable(tmp_path):
    with pytest.raises(SettingsError, match="COLLECTOR_LOG_FORMAT must be 'text' or 'json', got 'xml'"):
        Settings.from_env({"COLLECTOR_LOG_FORMAT": "xml"}).check()
    assert Settings.from_env({"COLLECTOR_LOG_FORMAT": " JSON "}).log_format == "json"
    assert Settings.from_env({}).log_format == "text"
    result = run(collector_command("serve", "--port", "0", "--db", str(tmp_path / "x.db")),
                 child_env(COLLECTOR_LOG_FORMAT="xml"), timeout=30)
    assert result.returncode == 1
    assert "Error: COLLECTOR_LOG_FORMAT must be 'text' or 'json', got 'xml'" in result.stderr


def test_exception_is_one_line_with_the_traceback_as_a_string():
    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        record = logging.LogRecord("collector", logging.ERROR, __file__, 1, "failed %s", ("here",), sys.exc_info())
    record.request_id = None
    line = JsonFormatter().format(record)
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["message"] == "failed here" and entry["level"] == "ERROR" and entry["request_id"] is None
    assert entry["exc_info"].startswith("Traceback (most recent call last):")
    assert entry["exc_info"].endswith("ValueError: boom\nsecond line")


@pytest.mark.parametrize(
    "query, logged",
    [("", ""),
     ("file=a.out&offset=0", "file=a.out&offset=0"),  # untouched, exactly as sent
     ("token=abc&limit=5", "token=REDACTED&limit=5"),
     ("access_token=abc&api_key=k&Password=p&cluster=c",
      "access_token=REDACTED&api_key=REDACTED&Password=REDACTED&cluster=c")],
)
def test_credential_query_parameters_are_redacted(query, logged):
    assert redact_query(query) == logged


def test_servers_leave_out_the_record_fields_no_format_prints(monkeypatch):
    # Restored after the test: the switches are process-wide.
    for name in ("_srcfile", "logThreads", "logMultiprocessing"):
        monkeypatch.setattr(logging, name, getattr(logging, name))
    serving.options(Settings())
    record = logging.getLogger("collector.jobs").makeRecord("collector.jobs", logging.INFO, "(unknown file)", 0,
                                                           "job %s", ("j1",), None)
    assert (logging._srcfile, record.thread, record.threadName, record.processName) == (None, None, None, None)
    # The text format's fields are all there.
    line = logging.Formatter(serving.GUNICORN_TEXT_FORMAT).format(record)
    assert line.endswith(f"[{record.process}] INFO collector.jobs: job j1")
