"""The tokens file end to end: `collector token`, `collector serve --tokens-file`, roles, cluster scope and audit.

tests/test_credentials.py checks the credential model on its own and tests/test_auth_matrix.py
every route against every credential; this module checks what an operator and a client see:
the secret printed once and stored nowhere, the listing, a file the server refuses, scope
as each write route applies it, and who wrote what in the events and the access log.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import os
import re
import stat
import uuid
from pathlib import Path

import pytest
import requests
from click.testing import CliRunner
from click.testing import Result

from collector import credentials
from collector import fanout
from collector.cli import main
from collector.db import Database
from collector.janitor import Janitor
from collector.settings import Settings
from tests.helpers import LiveServer
from tests.helpers import report
from tests.helpers import send
from tests.helpers import wait_for
from tests.processes import ServerProcess
from tests.processes import child_env
from tests.processes import collector_command
from tests.processes import run

UPDATE = {"status": "starting", "stage": "starting", "message": "Job started on node-01",
          "updated_at": "2026-12-04T10:00:00Z"}


def unique(prefix: str) -> str:
    """A credential name no other test uses: credential_uses outlives each test's cleanup."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def cli(*args: str, **env: str | None) -> Result:
    """`collector ARGS` in this process, with stdout and stderr apart."""
    return CliRunner().invoke(main, list(args), env={"COLLECTOR_TOKENS_FILE": None, **env})


def submit_body(job_id: str, cluster: str | None = None) -> dict:
    body = {"job_id": job_id, "job_name": f"n-{job_id}", "submitted_at": "2026-12-04T09:00:00Z"}
    return {**body, "cluster": cluster} if cluster else body


def table(output: str) -> list[list[str]]:
    """`collector token list`'s rows, split into cells."""
    return [line.split() for line in output.splitlines()]


@pytest.fixture
def tokens_path(tmp_path) -> Path:
    return tmp_path / "etc" / "tokens.json"


@pytest.fixture
def keys(tokens_path) -> dict[str, str]:
    """One credential of each kind in ``tokens_path``: name -> secret."""
    return {
        "reader": credentials.add(tokens_path, "reader", "read"),
        "writer": credentials.add(tokens_path, "writer", "write"),
        "b200": credentials.add(tokens_path, "b200", "write", ("b200",)),
        "ops": credentials.add(tokens_path, "ops", "admin"),
    }


@pytest.fixture
def filed(serve, tokens_path, keys) -> LiveServer:
    """A collector reading ``tokens_path``, writing down credential uses five times a second."""
    return serve(tokens_file=tokens_path, stale_check_s=0.2)


# --- collector token ------------------------------------------------------------------------


def test_token_add_prints_the_secret_once_on_its_last_line_and_stores_only_the_digest(database, tmp_path):
    path = tmp_path / "tokens.json"
    env = child_env(COLLECTOR_TOKENS_FILE=str(path), COLLECTOR_DATABASE_URL=database.url)
    added = run(collector_command("token", "add", "b200-reporter", "--role", "write", "--cluster", "b200"), env)
    assert added.returncode == 0, added.stderr
    *before, secret = added.stdout.splitlines()
    assert secret.startswith("clt_") and len(secret) > 40
    assert added.stdout.count(secret) == 1 and added.stdout.endswith(secret + "\n")
    assert before and not any(secret in line for line in before)
    assert "b200-reporter" in before[0] and "export SRTCTL_STATUS_TOKEN=" in "".join(before)
    body = path.read_text()
    assert secret not in body and secret[4:] not in body
    assert hashlib.sha256(secret.encode()).hexdigest() in body
    assert stat.S_IMODE(path.stat().st_mode) == 0o600

    listed = run(collector_command("token", "list"), env)
    assert listed.returncode == 0 and listed.stderr == "", listed.stderr
    [entry] = json.loads(path.read_text())["tokens"]
    assert table(listed.stdout) == [
        ["NAME", "ROLE", "CLUSTERS", "CREATED", "LAST", "USED"],
        ["b200-reporter", "write", "b200", entry["created_at"], "never"],
    ]
    assert secret not in listed.stdout and entry["sha256"] not in listed.stdout


def test_token_list_shows_every_column_and_json_never_a_secret(database, tokens_path):
    names = {role: unique(role) for role in ("read", "write", "admin")}
    secrets = [credentials.add(tokens_path, names["read"], "read", now=dt.datetime(2026, 12, 1, 8, tzinfo=dt.UTC)),
               credentials.add(tokens_path, names["write"], "write", ("b200", "h100"),
                               now=dt.datetime(2026, 12, 2, 9, 30, 5, tzinfo=dt.UTC)),
               credentials.add(tokens_path, names["admin"], "admin")]
    created = {e["name"]: e["created_at"] for e in json.loads(tokens_path.read_text())["tokens"]}
    listed = cli("token", "list", "--file", str(tokens_path), "--db", database.url)
    assert listed.exit_code == 0 and listed.stderr == "", listed.stderr
    assert table(listed.stdout) == [
        ["NAME", "ROLE", "CLUSTERS", "CREATED", "LAST", "USED"],
        [names["read"], "read", "*", "2026-12-01T08:00:00Z", "never"],
        [names["write"], "write", "b200,h100", "2026-12-02T09:30:05Z", "never"],
        [names["admin"], "admin", "*", created[names["admin"]], "never"],
    ]
    as_json = cli("token", "list", "--json", "--db", database.url, COLLECTOR_TOKENS_FILE=str(tokens_path))
    assert json.loads(as_json.stdout) == [
        {"name": names["read"], "role": "read", "clusters": [], "created": "2026-12-01T08:00:00Z",
         "last_used": "never"},
        {"name": names["write"], "role": "write", "clusters": ["b200", "h100"], "created": "2026-12-02T09:30:05Z",
         "last_used": "never"},
        {"name": names["admin"], "role": "admin", "clusters": [], "created": created[names["admin"]],
         "last_used": "never"},
    ]
    for secret in secrets:
        assert secret not in listed.stdout + as_json.stdout
        assert credentials.digest(secret) not in listed.stdout + as_json.stdout


def test_last_used_appears_once_the_janitor_writes_it(serve, database, tokens_path):
    used, idle = unique("used"), unique("idle")
    secret = credentials.add(tokens_path, used, "read")
    credentials.add(tokens_path, idle, "read")
    api = serve(tokens_file=tokens_path, stale_check_s=0.2)
    before = dt.datetime.now(dt.UTC).replace(microsecond=0)
    assert api.get("/api/jobs", token=secret).status_code == 200

    def last_used() -> dict[str, str] | None:
        listed = cli("token", "list", "--json", "--file", str(tokens_path), "--db", database.url)
        assert listed.exit_code == 0, listed.output
        rows = {row["name"]: row["last_used"] for row in json.loads(listed.stdout)}
        return rows if rows[used] != "never" else None

    rows = wait_for(last_used, 10, "the janitor to write down the use")
    assert before <= dt.datetime.fromisoformat(rows[used]) <= dt.datetime.now(dt.UTC)
    assert rows[idle] == "never"
    shown = [line.split() for line in cli("token", "list", "--file", str(tokens_path), "--db",
                                          database.url).stdout.splitlines()]
    assert [used, "read", "*"] == shown[1][:3] and shown[1][4] == rows[used]


def test_last_used_is_unknown_when_the_database_cannot_tell(tokens_path, new_database, tmp_path):
    credentials.add(tokens_path, "grafana", "read")
    [entry] = json.loads(tokens_path.read_text())["tokens"]
    unmigrated = new_database()
    if unmigrated.startswith("sqlite"):
        Path(unmigrated.removeprefix("sqlite:///")).touch()  # an empty SQLite database
    for db, why in [(str(tmp_path / "missing.db"), "does not exist"),
                    (unmigrated, "is not migrated (run `collector db upgrade`)"),
                    ("postgresql://nobody:pw-hidden@127.0.0.1:1/none", "cannot read database"),
                    ("nosuchdialect://x", "cannot read database")]:
        listed = cli("token", "list", "--file", str(tokens_path), "--db", db)
        assert listed.exit_code == 0, listed.output
        assert table(listed.stdout)[1] == ["grafana", "read", "*", entry["created_at"], "unknown"]
        assert listed.stderr.count("\n") == 1 and why in listed.stderr, listed.stderr
        assert listed.stderr.startswith("warning: last used unknown") and "pw-hidden" not in listed.stderr
    assert not (tmp_path / "missing.db").exists()  # listing never creates a database


def test_token_remove_takes_the_credential_out(tokens_path, keys):
    removed = cli("token", "remove", "writer", "--file", str(tokens_path))
    assert removed.exit_code == 0 and "removed credential 'writer'" in removed.stdout, removed.output
    names = [e["name"] for e in json.loads(tokens_path.read_text())["tokens"]]
    assert names == ["reader", "b200", "ops"]
    again = cli("token", "remove", "writer", "--file", str(tokens_path))
    assert again.exit_code == 1 and again.stdout == ""
    assert f"no credential called 'writer' in {tokens_path}" in again.stderr


@pytest.mark.parametrize("args, problem", [
    (["b200", "--role", "write"], "a credential called 'b200' exists"),
    (["bad name", "--role", "read"], "name: String should match pattern"),
    (["env:write", "--role", "admin"], "name: String should match pattern"),
    (["viewer", "--role", "read", "--cluster", "b200"], "only write credentials are limited to clusters"),
    (["root", "--role", "admin", "--cluster", "b200"], "only write credentials are limited to clusters"),
])
def test_token_add_refusals_print_nothing_on_stdout(tokens_path, keys, args, problem):
    before = tokens_path.read_bytes()
    added = cli("token", "add", *args, "--file", str(tokens_path))
    assert added.exit_code == 1, added.output
    assert added.stdout == "" and problem in added.stderr, added.stderr
    assert tokens_path.read_bytes() == before


def test_token_commands_need_a_file(tmp_path):
    for args in (["add", "x", "--role", "read"], ["remove", "x"], ["list"]):
        result = cli("token", *args, COLLECTOR_TOKENS_FILE="")
        assert result.exit_code == 2 and result.stdout == ""
        assert "no tokens file: pass --file PATH or set COLLECTOR_TOKENS_FILE" in result.stderr


# --- files the collector refuses ------------------------------------------------------------


def refused_by_serve(database, path: Path, *extra: str, env: dict[str, str] | None = None) -> str:
    """`collector serve --tokens-file PATH` must stop at startup; its stderr."""
    result = run(collector_command("serve", "--port", "0", "--db", database.url, "--tokens-file", str(path), *extra),
                 child_env(**(env or {})), timeout=60)
    assert result.returncode != 0, result.stderr
    assert "listening on" not in result.stderr
    return result.stderr


@pytest.mark.parametrize("change, reason", [
    (lambda p: p.chmod(0o620), "is writable by its group (mode 0620)"),
    (lambda p: p.chmod(0o602), "is writable by others (mode 0602)"),
    (lambda p: os.chown(p, 65534, 65534), "belongs to uid 65534"),
], ids=["group-writable", "world-writable", "another-owner"])
def test_an_unsafe_file_stops_serve_and_token_add(database, tokens_path, keys, change, reason):
    if "uid" in reason and os.geteuid() != 0:
        pytest.skip("giving the file to uid 65534 needs root")
    change(tokens_path)
    assert reason in refused_by_serve(database, tokens_path)
    added = cli("token", "add", "another", "--role", "read", "--file", str(tokens_path))
    assert added.exit_code == 1 and added.stdout == "" and reason in added.stderr


def _duplicate(body: dict) -> dict:
    body["tokens"].append({**body["tokens"][0], "sha256": "0" * 64})
    return body


@pytest.mark.parametrize("edit, problem", [
    (lambda body: "{\"version\": 1, \"tokens\": [", "Invalid JSON"),
    (lambda body: {**body, "tokens": [{**body["tokens"][0], "comment": "x"}]},
     "tokens.0.comment: Extra inputs are not permitted"),
    (_duplicate, "two credentials share the name 'reader'"),
], ids=["invalid-json", "unknown-field", "duplicate-name"])
def test_an_invalid_file_is_refused_naming_the_problem(database, tokens_path, keys, edit, problem):
    edited = edit(json.loads(tokens_path.read_text()))
    tokens_path.write_text(edited if isinstance(edited, str) else json.dumps(edited))
    assert problem in refused_by_serve(database, tokens_path)
    for args in (["list", "--db", database.url], ["add", "another", "--role", "read"], ["remove", "writer"]):
        result = cli("token", *args, "--file", str(tokens_path))
        assert result.exit_code == 1 and result.stdout == "" and problem in result.stderr, result.output


def test_the_in_process_probe_refuses_a_tokens_file_without_the_write_token(database, tokens_path, keys):
    stderr = refused_by_serve(database, tokens_path, "--probe-cluster", "b200")
    assert "--probe-cluster reports with the write token $SRTCTL_STATUS_TOKEN, which is not set" in stderr
    assert "collector probe --cluster b200" in stderr


# --- roles, scope and audit, end to end -----------------------------------------------------


def test_serve_with_a_tokens_file_logs_who_did_what_never_a_secret(database, tmp_path):
    # A relative --tokens-file, as typed in a shell: the startup line names the absolute path.
    database.clean()
    path = tmp_path / "tokens.json"
    writer, reader = credentials.add(path, "writer", "write"), credentials.add(path, "reader", "read")
    env = child_env(COLLECTOR_LOG_FORMAT="json", COLLECTOR_DATABASE_URL=database.url, COLLECTOR_WORKERS="1")
    server = ServerProcess(collector_command("serve", "--port", "0", "--tokens-file", "tokens.json"), env, cwd=tmp_path)
    try:
        put = requests.put(server.url + "/api/jobs/audit-1", json=UPDATE, timeout=5,
                           headers={"Authorization": f"Bearer {writer}"})
        read = requests.get(server.url + "/api/jobs/audit-1", timeout=5, headers={"Authorization": f"Bearer {reader}"})
        wrong = requests.get(server.url + "/api/jobs", timeout=5, headers={"Authorization": f"Bearer {writer}x"})
        assert [put.status_code, read.status_code, wrong.status_code] == [200, 200, 401]
        assert [e["credential"] for e in read.json()["events"]] == ["writer"]
    finally:
        assert server.stop() == 0
    entries = [json.loads(line) for line in server.output.splitlines()]
    [startup] = [e for e in entries if e["message"].startswith("collector listening on")]
    assert startup["message"].endswith(f", tokens file {path} (2 credentials))")
    access = {e["request_id"]: e for e in entries if e["logger"] == "collector.access"}
    for response, name in [(put, "writer"), (read, "reader"), (wrong, None)]:
        line = access[response.headers["X-Request-ID"]]
        assert line["credential"] == name
        assert line["message"].endswith(f"credential={name or '-'}")
    assert writer not in server.output and reader not in server.output
    assert writer[4:20] not in server.output and credentials.digest(writer) not in server.output


def test_each_role_may_do_what_it_says(filed, keys):
    assert filed.post("/api/jobs", json=submit_body("r-1"), token=keys["writer"]).status_code == 201
    assert filed.get("/api/jobs/r-1", token=keys["reader"]).status_code == 200
    refused = filed.post("/api/jobs", json=submit_body("r-2"), token=keys["reader"])
    assert refused.status_code == 403 and "'reader' has the read role" in refused.json()["detail"]
    delete = filed.delete("/api/jobs/r-1", token=keys["writer"])
    assert delete.status_code == 403 and "DELETE needs an admin credential" in delete.json()["detail"]
    assert filed.delete("/api/jobs/r-1", token=keys["ops"]).status_code == 200
    assert filed.get("/api/jobs/r-1", token=keys["ops"]).status_code == 404
    assert filed.get("/api/jobs", token=None).status_code == 401


def assert_out_of_scope(response: requests.Response, cluster: str) -> None:
    assert response.status_code == 403, response.text
    assert response.json()["detail"] == f"credential 'b200' may write cluster b200, not {cluster}"
    assert response.json()["clusters"] == ["b200"]


def test_a_scoped_credential_writes_its_cluster_only(filed, keys):
    b200, ops = keys["b200"], keys["ops"]
    assert_out_of_scope(filed.post("/api/jobs", json=submit_body("s-1", "h100"), token=b200), "h100")
    # Naming no cluster, it writes its one cluster.
    created = filed.post("/api/jobs", json=submit_body("s-1"), token=b200)
    assert created.status_code == 201 and created.json()["cluster"] == "b200"
    assert filed.get("/api/jobs/s-1", token=b200).json()["cluster"] == "b200"
    # PUT: metadata.cluster is scoped; without it the update lands on b200.
    assert_out_of_scope(filed.put("/api/jobs/s-1", json={**UPDATE, "metadata": {"cluster": "h100"}}, token=b200),
                        "h100")
    assert filed.put("/api/jobs/s-1", json={**UPDATE, "metadata": {"cluster": "b200"}},
                     token=b200).status_code == 200
    # A job of h100 is out of its reach: the same id without a cluster is b200's own job.
    assert filed.post("/api/jobs", json=submit_body("s-2", "h100"), token=ops).status_code == 201
    mine = filed.put("/api/jobs/s-2", json=UPDATE, token=b200)
    assert mine.status_code == 200 and mine.json()["cluster"] == "b200"
    theirs = filed.get("/api/jobs/s-2", params={"cluster": "h100"}, token=ops).json()
    assert theirs["status"] == "submitted" and len(theirs["events"]) == 1
    # Logs, captures and cluster status: ?cluster= and the path are scoped the same way.
    logs = filed.post("/api/jobs/s-1/logs", params={"file": "a.out", "offset": 0, "cluster": "h100"}, data=b"x",
                      headers={"Content-Type": "application/octet-stream"}, token=b200)
    assert_out_of_scope(logs, "h100")
    assert filed.post("/api/jobs/s-1/logs", params={"file": "a.out", "offset": 0}, data=b"x",
                      headers={"Content-Type": "application/octet-stream"}, token=b200).status_code == 200
    assert_out_of_scope(send(filed, "s-1", "cap.txt", 0, 1, b"x", cluster="h100", token=b200), "h100")
    assert send(filed, "s-1", "cap.txt", 0, 1, b"x", cluster="b200", token=b200).status_code == 200
    assert_out_of_scope(report(filed, "h100", token=b200), "h100")
    assert report(filed, "b200", token=b200).status_code == 200
    # Nothing of h100 was written by it.
    events = filed.get("/api/events", token=ops).json()["events"]
    assert {e["cluster"] for e in events if e["credential"] == "b200"} == {"b200"}


def test_events_and_access_lines_name_the_credential_never_the_secret(filed, keys, caplog):
    caplog.set_level(logging.INFO, logger="collector.access")
    assert filed.post("/api/jobs", json=submit_body("a-1", "b200"), token=keys["b200"]).status_code == 201
    assert filed.put("/api/jobs/a-1", json=UPDATE, token=keys["writer"]).status_code == 200
    job = filed.get("/api/jobs/a-1", token=keys["reader"]).json()
    assert [(e["status"], e["credential"]) for e in job["events"]] == [("submitted", "b200"), ("starting", "writer")]
    feed = filed.get("/api/events", token=keys["reader"]).json()["events"]
    assert [(e["job_id"], e["credential"]) for e in feed] == [("a-1", "b200"), ("a-1", "writer")]
    lines = [r.getMessage() for r in caplog.records if r.name == "collector.access"]
    assert [line.rsplit(" ", 1)[1] for line in lines] == [
        "credential=b200", "credential=writer", "credential=reader", "credential=reader"]
    assert all(getattr(r, "credential", None) for r in caplog.records if r.name == "collector.access")
    for secret in keys.values():
        assert secret not in caplog.text and credentials.digest(secret) not in caplog.text


def test_the_environment_tokens_work_beside_the_file(serve, tokens_path, keys):
    write, read = "w-" + uuid.uuid4().hex, "r-" + uuid.uuid4().hex
    api = serve(tokens_file=tokens_path, write_token=write, read_token=read)
    assert api.post("/api/jobs", json=submit_body("e-1", "h100"), token=write).status_code == 201
    assert api.put("/api/jobs/e-1", json=UPDATE, token=keys["writer"]).status_code == 200
    job = api.get("/api/jobs/e-1", token=read)
    assert job.status_code == 200
    assert [e["credential"] for e in job.json()["events"]] == ["env:write", "writer"]
    assert api.post("/api/jobs", json=submit_body("e-2"), token=read).status_code == 403
    assert api.delete("/api/jobs/e-1", token=write).status_code == 200
    assert api.get("/api/jobs/e-1", token=keys["reader"]).status_code == 404


def test_a_credential_added_while_serving_works_at_its_first_use(filed, tokens_path, keys):
    added = cli("token", "add", "late", "--role", "write", "--cluster", "gb200", "--file", str(tokens_path))
    secret = added.stdout.splitlines()[-1]
    created = filed.post("/api/jobs", json=submit_body("l-1"), token=secret)
    assert created.status_code == 201 and created.json()["cluster"] == "gb200"


# --- what a process does when the file or the database fails it ------------------------------


def reloads(server: LiveServer, token: str) -> dict[str, float]:
    """``collector_tokens_file_reloads_total`` by result, as the server's /metrics says now."""
    text = server.get("/metrics", token=token).text
    found = re.findall(r'^collector_tokens_file_reloads_total\{result="(\w+)"\} ([\d.]+)$', text, re.MULTILINE)
    return {"ok": 0.0, "failed": 0.0, **{result: float(value) for result, value in found}}


def replace(path: Path, text: str) -> None:
    """Write ``path`` anew by rename, as `collector token` does (a new inode: the change is seen at once)."""
    temp = path.with_name(path.name + ".new")
    temp.write_text(text)
    temp.chmod(0o600)
    os.replace(temp, path)


def test_a_broken_and_a_fixed_file_are_counted_in_metrics(filed, tokens_path, keys):
    ops = keys["ops"]
    before = reloads(filed, ops)
    good = json.loads(tokens_path.read_text())
    replace(tokens_path, '{"version": 1, "tokens": [')
    # An unknown token makes the process look at the file at once: broken, so it keeps what it knew.
    assert filed.get("/api/jobs", token="not-a-credential").status_code == 401
    assert filed.get("/api/jobs", token=ops).status_code == 200
    broken = reloads(filed, ops)
    assert broken == {"ok": before["ok"], "failed": before["failed"] + 1}
    added = credentials.new_secret()
    good["tokens"].append({"name": "added", "role": "read", "clusters": [], "sha256": credentials.digest(added),
                           "created_at": "2026-12-04T12:00:00Z"})
    replace(tokens_path, json.dumps(good))
    assert filed.get("/api/jobs", token=added).status_code == 200
    assert reloads(filed, ops) == {"ok": before["ok"] + 1, "failed": before["failed"] + 1}


def test_uses_the_database_cannot_take_are_dropped_with_a_warning(tmp_path, tokens_path, keys, caplog):
    # Not migrated: the credential_uses table is missing, as on a database the janitor cannot write.
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'empty.db'}", tokens_file=tokens_path)
    database = Database(settings)
    ring = credentials.keyring_for(settings)
    janitor = Janitor(database, settings, fanout.Hub(database, settings), keyring=ring)
    assert ring.lookup(keys["reader"]) == credentials.Credential("reader", "read")
    with caplog.at_level(logging.WARNING, logger="collector.stale"):
        janitor.write_uses()  # must not raise: the janitor thread runs on
    assert [r.getMessage() for r in caplog.records if r.name == "collector.stale"] == [
        "cannot write down credential uses"]
    assert ring.take_uses() == {}  # taken, and lost: a "last used" is not worth retrying
    database.engine.dispose()
