"""``collector prune``: finished jobs (or only their blobs) past a cutoff, as a real subprocess."""

from __future__ import annotations

import datetime as dt

import pytest

from tests.processes import child_env
from tests.processes import collector_command
from tests.processes import run


def _ago(days: float) -> str:
    return (dt.datetime.now(dt.UTC) - dt.timedelta(days=days)).isoformat().replace("+00:00", "Z")


def _job(server, job_id: str, *, cluster: str, status: str, days_ago: float, log: bytes = b"") -> None:
    """A job last updated ``days_ago`` in ``status``, with one log file of ``log`` if given."""
    assert server.put(f"/api/jobs/{job_id}", json={"status": status, "updated_at": _ago(days_ago),
                                                   "metadata": {"cluster": cluster}}).status_code == 200
    if log:
        response = server.post(f"/api/jobs/{job_id}/logs", params={"file": "w.out", "offset": 0, "cluster": cluster},
                               data=log, headers={"Content-Type": "application/octet-stream"})
        assert response.json() == {"job_id": job_id, "stored": 1}


def _prune(database, *args: str) -> str:
    result = run(collector_command("prune", "--db", database.url, *args), child_env())
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.fixture
def seeded(serve):
    server = serve()
    _job(server, "old-done", cluster="a", status="completed", days_ago=40, log=b"x" * 10)
    _job(server, "old-failed", cluster="b", status="failed", days_ago=40, log=b"y" * 5)
    _job(server, "old-running", cluster="a", status="benchmark", days_ago=40, log=b"z")
    _job(server, "new-done", cluster="a", status="completed", days_ago=1)
    return server


def _ids(server) -> set[str]:
    return {job["job_id"] for job in server.get("/api/jobs").json()["jobs"]}


def test_dry_run_reports_and_removes_nothing(seeded, database):
    out = _prune(database, "--older-than", "30", "--dry-run")
    assert out.startswith("would remove 2 jobs finished before ")
    assert out.endswith("with 2 log/capture files (15 bytes)")
    assert _ids(seeded) == {"old-done", "old-failed", "old-running", "new-done"}


def test_prune_removes_old_finished_jobs_only_in_small_batches(seeded, database):
    out = _prune(database, "--older-than", "30", "--batch-size", "1")
    assert out.endswith("with 2 log/capture files (15 bytes)") and out.startswith("removed 2 jobs")
    assert _ids(seeded) == {"old-running", "new-done"}
    assert seeded.get("/api/jobs/old-done/logs").status_code == 404
    with database.engine.connect() as conn:
        from sqlalchemy import text

        assert conn.execute(text("SELECT count(*) FROM blob_chunks")).scalar() == 1  # old-running's
    database.assert_counts_match_jobs()


@pytest.mark.parametrize(("args", "left"), [
    (("--cluster", "b"), {"old-done", "old-running", "new-done"}),
    (("--status", "completed"), {"old-failed", "old-running", "new-done"}),
])
def test_prune_filters(seeded, database, args, left):
    assert _prune(database, "--older-than", "30", *args).startswith("removed 1 jobs")
    assert _ids(seeded) == left
    database.assert_counts_match_jobs()


def test_logs_only_keeps_jobs_and_events(seeded, database):
    out = _prune(database, "--older-than", "30", "--logs-only")
    assert out.startswith("removed 2 log/capture files (15 bytes) of 2 jobs finished before ")
    assert _ids(seeded) == {"old-done", "old-failed", "old-running", "new-done"}
    assert seeded.get("/api/jobs/old-done/logs").json()["files"] == []
    assert seeded.get("/api/jobs/old-done").json()["status"] == "completed"
    assert _prune(database, "--older-than", "30", "--logs-only").startswith("removed 0 log/capture files")


@pytest.mark.parametrize(("args", "says"), [
    (("--older-than", "-1"), "-1.0 is not in the range x>=0"),
    (("--older-than", "x"), "'x' is not a valid float"),
    (("--older-than", "1", "--status", "running"), "'running' is not one of"),
    ((), "Missing option '--older-than'"),
])
def test_prune_rejects_bad_arguments(database, args, says):
    result = run(collector_command("prune", "--db", database.url, *args), child_env())
    assert result.returncode == 2
    assert says in result.stderr
