"""The OpenAPI document: built from the routes, valid, served, checked in, and true of a live server."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from openapi_spec_validator import validate

from collector.app import create_app
from collector.openapi import document
from collector.settings import Settings
from tests.processes import ServerProcess
from tests.processes import child_env
from tests.processes import collector_command

ROOT = Path(__file__).resolve().parents[1]
CHECKED_IN = ROOT / "docs" / "openapi.json"
REGENERATE = "docs/openapi.json is stale: regenerate it with `collector openapi > docs/openapi.json`"
# Enough generated requests per operation to reach past the happy path; under a minute per database.
EXAMPLES = "100"


@pytest.fixture(scope="module")
def built() -> dict:
    return document(create_app(Settings(database_url="sqlite://")))


def test_document_is_valid_openapi_3_1(built):
    assert built["openapi"].startswith("3.1.")
    validate(built)


def test_checked_in_copy_is_the_built_document(built):
    assert json.loads(CHECKED_IN.read_text()) == built, REGENERATE


def test_cli_prints_the_document(built):
    printed = subprocess.run(collector_command("openapi"), capture_output=True, text=True, check=True,
                             env=child_env()).stdout
    assert json.loads(printed) == built


def test_every_route_is_documented(built):
    app = create_app(Settings(database_url="sqlite://"))
    routes = {(rule.rule, method.lower()) for rule in app.url_map.iter_rules() if rule.endpoint != "static"
              for method in (rule.methods or set()) - {"HEAD", "OPTIONS"}}
    documented = {(path, method) for path, item in built["paths"].items() for method in item}
    as_flask = {(path.replace("{", "<").replace("}", ">"), method) for path, method in documented}
    flask_routes = {(_plain(rule), method) for rule, method in routes}
    assert flask_routes == as_flask


def _plain(rule: str) -> str:
    """``/api/jobs/<path:name>`` as ``/api/jobs/<name>``: converters are not part of the document's path."""
    return re.sub(r"<(?:[a-z]+:)?([a-z_]+)>", r"<\1>", rule)


def test_served_open_without_a_token(serve, built):
    server = serve(write_token="w-secret", read_token="r-secret")
    response = requests.get(server.url + "/api/openapi.json", timeout=10)
    assert response.status_code == 200
    assert response.headers["Content-Type"] == "application/json"
    # The server's own document: with tokens configured /metrics needs one, so only it differs.
    served = response.json()
    assert served == document(server.app)
    assert {path: item for path, item in served["paths"].items() if path != "/metrics"} == {
        path: item for path, item in built["paths"].items() if path != "/metrics"}
    assert "security" not in served["paths"]["/metrics"]["get"] and built["paths"]["/metrics"]["get"]["security"] == []


def test_schemathesis_finds_no_server_error_or_schema_violation(database, tmp_path):
    """Fuzz every operation but the streams against `collector serve`, with the write token."""
    token = "w-fuzz"
    server = ServerProcess(collector_command("serve", "--port", "0", "--db", database.url),
                           child_env(SRTCTL_STATUS_TOKEN=token, SRTCTL_STATUS_READ_TOKEN="r-fuzz",
                                     COLLECTOR_ACCESS_LOG_LEVEL="warning"))
    try:
        run = subprocess.run(
            [sys.executable, "-c", "from schemathesis.cli import schemathesis; schemathesis()", "run",
             server.url + "/api/openapi.json", "--header", f"Authorization: Bearer {token}",
             "--checks", "not_a_server_error,status_code_conformance,content_type_conformance,"
                         "response_schema_conformance,response_headers_conformance",
             # A stream never ends, so a generated request to one would wait for its lifetime.
             "--exclude-path-regex", "stream$", "--max-examples", EXAMPLES, "--seed", "1",
             "--report-dir", str(tmp_path)],
            capture_output=True, text=True, timeout=600, env=child_env(), cwd=tmp_path)
    finally:
        server.stop()
        database.clean()  # the fuzzed jobs are no other test's
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    # Every generated case passed, and there were enough of them to reach past the happy path.
    counts = re.search(r"(\d+) generated, (\d+) passed", run.stdout)
    assert counts and counts[1] == counts[2] and int(counts[1]) >= 1000, run.stdout[-3000:]
