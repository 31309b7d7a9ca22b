"""`collector report`, `collector stream-logs` and `collector wrap` as real processes against a live collector."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from tests.helpers import closed_port_url
from tests.helpers import detail
from tests.helpers import log_files
from tests.helpers import new_id
from tests.helpers import wait_for
from tests.processes import child_env
from tests.processes import collector_command
from tests.processes import run


def env_for(api, job_id: str | None = None, **extra: str) -> dict[str, str]:
    """A batch job's environment: the token, and SLURM_* variables only as given."""
    env = {k: v for k, v in child_env().items() if not k.startswith("SLURM_")}
    env["SRTCTL_STATUS_TOKEN"] = api.token
    if job_id:
        env["SLURM_JOB_ID"] = job_id
    env.update(extra)
    return env


def collector(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return run(collector_command(*args), env, timeout=60)


def final_state(api, job_id) -> tuple:
    job = detail(api, job_id)
    return job["status"], job["stage"], job["message"], job["exit_code"]


def log_text(api, job_id, name) -> str:
    body = api.get(f"/api/jobs/{job_id}/logs", params={"file": name}).json()
    return body["data"]


def test_report_commands_carry_a_job_through_its_lifecycle(api):
    job_id = new_id("c")
    env = env_for(api, job_id, SLURM_JOB_NAME="train", SLURM_CLUSTER_NAME="b200",
                  COLLECTOR_ENDPOINTS=api.url)
    steps = [
        ("submit", "--recipe", "job.sbatch", "--metadata", '{"tags": ["t1"]}'),
        ("started", "--head-node", "node-3", "--log-dir", "/lustre/run"),
        ("status", "benchmark", "--stage", "benchmark", "--message", "Running benchmark"),
        ("completed", "--exit-code", "0"),
    ]
    for step in steps:
        done = collector("report", *step, env=env)
        assert (done.returncode, done.stderr) == (0, ""), step
    job = detail(api, job_id)
    assert (job["job_name"], job["cluster"], job["recipe"], job["metadata"]["tags"]) == ("train", "b200", "job.sbatch",
                                                                                          ["t1"])
    assert (job["metadata"]["head_node"], job["metadata"]["log_dir"]) == ("node-3", "/lustre/run")
    assert final_state(api, job_id) == ("completed", "cleanup", "Benchmark completed successfully", 0)
    events = api.get(f"/api/jobs/{job_id}/events").json()["events"]
    assert [(e["status"], e["message"]) for e in events] == [
        ("submitted", None), ("starting", "Job started on node-3"), ("benchmark", "Running benchmark"),
        ("completed", "Benchmark completed successfully")]

    other = new_id("c")
    done = collector("report", "completed", "--exit-code", "4", "--job-id", other, "--endpoint", api.url,
                     "--cluster", "c9", env=env_for(api))
    assert done.returncode == 0
    assert final_state(api, other) == ("failed", "cleanup", "Job failed with exit code 4", 4)
    assert detail(api, other)["cluster"] == "c9"


def test_report_needs_an_endpoint_and_a_job_id(api):
    done = collector("report", "status", "starting", env=env_for(api, "1"))
    assert done.returncode == 2
    assert "no collector endpoint: pass --endpoint URL or set COLLECTOR_ENDPOINTS" in done.stderr
    done = collector("report", "status", "starting", "--endpoint", api.url, env=env_for(api))
    assert done.returncode == 2
    assert "no job id: pass --job-id or run inside a Slurm job (SLURM_JOB_ID)" in done.stderr
    done = collector("report", "status", "running", "--endpoint", api.url, env=env_for(api, "1"))
    assert done.returncode == 2
    assert "'running' is not one of 'submitted', 'starting'" in done.stderr


def test_unreachable_or_refused_reports_warn_but_exit_0_unless_strict(api):
    job_id = new_id("c")
    down = closed_port_url()
    env = env_for(api, job_id, COLLECTOR_ENDPOINTS=f"{down},{api.url}")
    done = collector("report", "status", "starting", env=env)
    assert done.returncode == 0
    assert "collector: status was not acknowledged by every endpoint (-v shows why)" in done.stderr
    assert detail(api, job_id)["status"] == "starting"  # the reachable endpoint still got it
    assert collector("report", "status", "workers", "--strict", env=env).returncode == 1
    refused = collector("report", "status", "workers", "--token-env", "NO_SUCH_TOKEN_VAR", "--endpoint", api.url,
                        env=env)
    assert refused.returncode == 0
    assert "HTTP 401: check the token" in refused.stderr
    assert detail(api, job_id)["status"] == "workers"  # by the --strict run, which reached api


def test_wrap_reports_the_lifecycle_and_streams_the_output(api, tmp_path):
    job_id = new_id("c")
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "bench.log").write_text("from the benchmark\n")
    env = env_for(api, job_id, SLURM_JOB_NAME="wrapped", SLURM_CLUSTER_NAME="b200", COLLECTOR_ENDPOINTS=api.url)
    done = collector("wrap", "--log-dir", str(logs), "--interval", "0.2", "--",
                     "sh", "-c", "echo to stdout; echo to stderr >&2; exit 0", env=env)
    assert done.returncode == 0, done.stderr
    assert (done.stdout, done.stderr) == ("to stdout\n", "to stderr\n")
    assert final_state(api, job_id) == ("completed", "cleanup", "Benchmark completed successfully", 0)
    job = detail(api, job_id)
    assert (job["job_name"], job["cluster"], job["metadata"]["log_dir"]) == ("wrapped", "b200", str(logs))
    assert log_files(api, job_id) == {f"wrap-{job_id}.out": (20, True), "bench.log": (19, True)}
    assert sorted(log_text(api, job_id, f"wrap-{job_id}.out").splitlines()) == ["to stderr", "to stdout"]
    assert (logs / f"wrap-{job_id}.out").exists()


def test_wrap_reports_failed_with_the_exit_code_and_keeps_it(api):
    job_id = new_id("c")
    env = env_for(api, job_id, COLLECTOR_ENDPOINTS=api.url)
    done = collector("wrap", "--", "sh", "-c", "echo boom; exit 7", env=env)
    assert done.returncode == 7
    assert final_state(api, job_id) == ("failed", "cleanup", "Job failed with exit code 7", 7)
    # Without --log-dir the output still streams, from a private directory removed afterwards.
    assert log_text(api, job_id, f"wrap-{job_id}.out") == "boom\n"
    assert detail(api, job_id)["metadata"]["log_dir"] is None

    missing = new_id("c")
    done = collector("wrap", "--job-id", missing, "--", "/no/such/program", env=env)
    assert done.returncode == 127
    assert "cannot run '/no/such/program'" in done.stderr
    status, _, message, code = final_state(api, missing)
    assert (status, code) == ("failed", 127) and "cannot run '/no/such/program'" in message


def test_wrap_exit_code_survives_a_dead_collector():
    env = {k: v for k, v in child_env().items() if not k.startswith("SLURM_")}
    started = time.monotonic()
    done = collector("wrap", "--endpoint", closed_port_url(), "--job-id", "9", "--", "sh", "-c", "exit 5", env=env)
    assert done.returncode == 5
    assert time.monotonic() - started < 10
    assert "collector: the started report was not acknowledged" in done.stderr


def test_sigterm_is_forwarded_and_reported_as_failed(api, tmp_path):
    job_id = new_id("c")
    marker = tmp_path / "trapped"
    env = env_for(api, job_id, COLLECTOR_ENDPOINTS=api.url)
    script = f"trap 'echo got TERM; touch {marker}; exit 1' TERM; echo ready; while :; do sleep 0.05; done"
    proc = subprocess.Popen(collector_command("wrap", "--interval", "0.1", "--", "sh", "-c", script), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        assert proc.stdout.readline() == "ready\n"
        wait_for(lambda: log_files(api, job_id).get(f"wrap-{job_id}.out", (0,))[0] == 6)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    assert marker.exists()  # the command got the signal
    assert out == "got TERM\n"
    assert final_state(api, job_id) == (
        "failed", "cleanup",
        "Job cancelled (SIGTERM, scancel or the time limit); the command exited with code 1; exit code 143", 143)
    assert log_text(api, job_id, f"wrap-{job_id}.out") == "ready\ngot TERM\n"


def test_a_command_that_ignores_sigterm_is_killed_after_the_grace(api):
    job_id = new_id("c")
    env = env_for(api, job_id, COLLECTOR_ENDPOINTS=api.url)
    proc = subprocess.Popen(collector_command("wrap", "--signal-grace", "0.3", "--", "sh", "-c",
                                              "trap '' TERM; echo ready; exec sleep 30"),
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        assert proc.stdout.readline() == "ready\n"
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143
    assert time.monotonic() - started < 3
    assert final_state(api, job_id) == (
        "failed", "cleanup",
        "Job cancelled (SIGTERM, scancel or the time limit); the command exited with code 137; exit code 143", 143)


def test_stream_logs_runs_until_sigterm_then_flushes_final(api, tmp_path):
    job_id = new_id("c")
    (tmp_path / "a.out").write_text("one\n")
    env = env_for(api, job_id, COLLECTOR_ENDPOINTS=api.url)
    proc = subprocess.Popen(collector_command("stream-logs", str(tmp_path), "--interval", "0.1", "--cluster", "c3"),
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: log_files(api, job_id) == {"a.out": (4, False)})
        with open(tmp_path / "a.out", "a") as handle:
            handle.write("two\n")
        (tmp_path / "sub").mkdir()
        (tmp_path / "sub" / "b.log").write_text("bee\n")
        wait_for(lambda: log_files(api, job_id) == {"a.out": (8, False), "sub/b.log": (4, False)})
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert (proc.returncode, out, err) == (0, "", "")
    assert log_files(api, job_id) == {"a.out": (8, True), "sub/b.log": (4, True)}
    assert detail(api, job_id)["cluster"] == "c3"
    assert os.path.exists(tmp_path / "a.out")
