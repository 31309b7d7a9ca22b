"""The `collector` command and `flask --app collector db`, as real subprocesses."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory

from collector.migrations import alembic_config
from collector.migrations import head_revision
from tests.helpers import Reporter
from tests.processes import ServerProcess
from tests.processes import child_env
from tests.processes import collector_command
from tests.processes import run


def test_serve_on_fresh_sqlite_migrates_and_takes_a_whole_srtctl_run(tmp_path):
    db = tmp_path / "state" / "status.db"
    server = ServerProcess(collector_command("serve", "--port", "0", "--db", str(db)), child_env())
    try:
        assert server.url.startswith("http://127.0.0.1:")
        reporter = Reporter(server.url, "4242")
        assert reporter.create("sweep", cluster="b200", recipe="r.yaml")
        assert all(reporter.run_lifecycle(job_name="sweep", cluster="b200"))
        job = reporter_detail(server.url, "4242")
        assert job["status"] == "completed" and len(job["events"]) == 9
    finally:
        assert server.stop() == 0
    assert db.exists()
    # One log line per lifecycle transition, with the job's cluster and id.
    transitions = [line for line in server.lines if "collector.jobs" in line]
    assert len(transitions) == 9
    assert "job b200/4242 -> completed/cleanup: Benchmark completed successfully" in transitions[-1]


def reporter_detail(url, job_id):
    import requests

    response = requests.get(f"{url}/api/jobs/{job_id}", timeout=5)
    assert response.status_code == 200
    return response.json()


def test_serve_with_tokens_and_cors_flags(tmp_path):
    env = child_env(MY_WRITE="w-token", MY_READ="r-token")
    args = collector_command("serve", "--port", "0", "--db", str(tmp_path / "s.db"), "--token-env", "MY_WRITE",
                             "--read-token-env", "MY_READ", "--cors-origin", "https://a.example",
                             "--cors-origin", "https://b.example")
    server = ServerProcess(args, env)
    try:
        assert Reporter(server.url, "1", token="w-token").create("n")
        assert not Reporter(server.url, "2", token="r-token").create("n")
        import requests

        read = requests.get(server.url + "/api/jobs/1", headers={"Authorization": "Bearer r-token",
                                                                  "Origin": "https://b.example"}, timeout=5)
        assert read.status_code == 200 and read.headers["Access-Control-Allow-Origin"] == "https://b.example"
        assert requests.get(server.url + "/api/jobs/1", timeout=5).status_code == 401
    finally:
        server.stop()
    assert "w-token" not in server.output and "r-token" not in server.output


@pytest.mark.parametrize(
    "args, env, message",
    [
        (["--host", "0.0.0.0"], {}, "refusing to listen on 0.0.0.0 without a token"),
        ([], {"SRTCTL_STATUS_READ_TOKEN": "r"}, "without a write token"),
    ],
)
def test_serve_refuses_unsafe_configurations(tmp_path, args, env, message):
    result = run(collector_command("serve", "--port", "0", "--db", str(tmp_path / "x.db"), *args),
                 child_env(**env), timeout=30)
    assert result.returncode != 0
    assert message in result.stderr


def test_serve_open_off_loopback_with_allow_unauthenticated(tmp_path):
    server = ServerProcess(collector_command("serve", "--host", "0.0.0.0", "--port", "0", "--db",
                                             str(tmp_path / "o.db"), "--allow-unauthenticated"), child_env())
    try:
        assert server.url.startswith("http://0.0.0.0:")
    finally:
        server.stop()


def test_db_upgrade_and_current(new_database):
    url = new_database()
    before = run(collector_command("db", "current", "--db", url), child_env())
    assert before.returncode == 0, before.stderr
    assert before.stdout.startswith("(none) (behind: run `collector db upgrade`")
    upgraded = run(collector_command("db", "upgrade"), child_env(COLLECTOR_DATABASE_URL=url))
    assert upgraded.returncode == 0, upgraded.stderr
    after = run(collector_command("db", "current", "--db", url), child_env())
    assert after.stdout.strip().endswith("(up to date)")


def test_flask_db_upgrade_migrates_the_configured_database(new_database):
    url = new_database()
    # Serving checks (no token off loopback) do not stop a migration.
    result = run([sys.executable, "-m", "flask", "--app", "collector", "db", "upgrade"],
                 child_env(COLLECTOR_DATABASE_URL=url, COLLECTOR_HOST="0.0.0.0"))
    assert result.returncode == 0, result.stderr
    after = run(collector_command("db", "current", "--db", url), child_env())
    assert after.stdout.strip().endswith("(up to date)")


def test_serve_refuses_an_unmigrated_postgres(postgres, new_database):
    url = new_database()
    result = run(collector_command("serve", "--port", "0", "--db", url), child_env(), timeout=30)
    assert result.returncode != 0
    assert "run `collector db upgrade`" in result.stderr


def test_serve_on_migrated_postgres(postgres):
    server = ServerProcess(collector_command("serve", "--port", "0", "--db", postgres.url), child_env())
    try:
        assert Reporter(server.url, "pg-1").create("n", cluster="c")
    finally:
        server.stop()


def test_db_recount_rebuilds_counts_after_edits_behind_our_back(serve, database):
    server = serve()
    for i in range(3):
        server.post("/api/jobs", json={"job_id": str(i), "job_name": "n", "cluster": "a",
                                       "submitted_at": "2025-01-26T10:30:00Z"})
    with database.engine.begin() as conn:
        from sqlalchemy import text

        conn.execute(text("UPDATE jobs SET status = 'failed' WHERE job_id = '1'"))
        conn.execute(text("DELETE FROM jobs WHERE job_id = '2'"))
    assert server.get("/api/jobs", params={"status": "failed"}).json()["total"] == 0
    result = run(collector_command("db", "recount", "--db", database.url), child_env())
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "job counts rebuilt"
    assert server.get("/api/jobs", params={"status": "failed"}).json()["total"] == 1
    assert server.get("/api/jobs").json()["total"] == 2
    database.assert_counts_match_jobs()


def test_db_downgrade_takes_a_relative_revision(new_database):
    url = new_database()
    assert run(collector_command("db", "upgrade", "--db", url), child_env()).returncode == 0
    result = run(collector_command("db", "downgrade", "--db", url, "-1"), child_env())
    assert result.returncode == 0, result.stderr
    current = run(collector_command("db", "current", "--db", url), child_env())
    before_head = ScriptDirectory.from_config(alembic_config(url)).get_revision(head_revision()).down_revision
    assert current.stdout.startswith(f"{before_head} (behind")


def test_serve_probe_cluster_reports_the_cluster_it_runs_on(tmp_path):
    # A PATH without Slurm's tools makes the outcome the same on every machine: the probe
    # runs, fails to find sinfo, and says so as the cluster's status.
    import requests

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    env = child_env(SRTCTL_STATUS_TOKEN="w-token", PATH=str(bin_dir))
    args = collector_command("serve", "--port", "0", "--db", str(tmp_path / "p.db"), "--probe-cluster", "login",
                             "--probe-interval", "1")
    server = ServerProcess(args, env)
    try:
        deadline = time.monotonic() + 15
        while True:
            state = requests.get(server.url + "/api/clusters/login/status",
                                 headers={"Authorization": "Bearer w-token"}, timeout=5).json()
            if state["status"] is not None or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert (state["status"], state["detail"], state["probe_silent"]) == (
            "unavailable", "sinfo: command not found", False)
    finally:
        server.stop()
    assert "probing Slurm cluster login every 1 s" in server.output
    assert "w-token" not in server.output


def test_serve_is_gunicorn_with_the_workers_asked_for(tmp_path):
    server = ServerProcess(collector_command("serve", "--port", "0", "--db", str(tmp_path / "w.db"), "--workers", "2"),
                           child_env())
    try:
        import requests

        response = requests.get(server.url + "/api/health", timeout=5)
        # The production server, never werkzeug's development server.
        assert (response.status_code, response.headers["Server"]) == (200, "gunicorn")
        # The longest file name the API takes, percent-encoded past gunicorn's default 4094-byte request line.
        name = ("run dir %/" * 410)[:4092] + ".out"
        params: dict[str, str | int] = {"file": name, "offset": 0}
        upload = requests.post(server.url + "/api/jobs/long-name/logs", params=params, data=b"hello\n", timeout=5)
        assert upload.status_code == 200, upload.text
        assert len(upload.request.url or "") > 4094
        workers = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _parent(p) == server.proc.pid]
        assert len(workers) == 2
    finally:
        assert server.stop() == 0
    assert server.output.count("collector listening on") == 1 and "collector stopped" in server.output


def _parent(proc_dir: Path) -> int | None:
    try:
        return int((proc_dir / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None  # gone meanwhile
