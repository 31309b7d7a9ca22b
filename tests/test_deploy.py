"""The deployment kit: the gunicorn config loads with the settings the environment gives it."""

from __future__ import annotations

import runpy
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import requests

from tests.processes import ROOT
from tests.processes import ServerProcess
from tests.processes import child_env
from tests.processes import collector_command
from tests.processes import run

CONFIG = ROOT / "deploy" / "gunicorn.conf.py"


@pytest.fixture(autouse=True)
def metrics_dir(monkeypatch, tmp_path):
    """Loading the config sets PROMETHEUS_MULTIPROC_DIR in this process: a test directory, unset afterwards."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "metrics"))


def test_gunicorn_config_reads_collector_variables(monkeypatch):
    monkeypatch.setenv("COLLECTOR_HOST", "::1")
    monkeypatch.setenv("COLLECTOR_PORT", "9123")
    monkeypatch.setenv("COLLECTOR_WORKERS", "3")
    monkeypatch.setenv("COLLECTOR_THREADS", "16")
    monkeypatch.setenv("COLLECTOR_MAX_STREAMS", "40")
    config = runpy.run_path(str(CONFIG))
    assert config["bind"] == ["[::1]:9123"]
    # Every stream a worker may hold gets a thread of its own on top of the request threads.
    assert (config["workers"], config["threads"], config["worker_class"]) == (3, 56, "gthread")
    assert config["worker_connections"] == 1056
    assert config["preload_app"] is False


def test_gunicorn_config_defaults_to_loopback_8080(monkeypatch):
    for name in ("COLLECTOR_HOST", "COLLECTOR_PORT"):
        monkeypatch.delenv(name, raising=False)
    assert runpy.run_path(str(CONFIG))["bind"] == ["127.0.0.1:8080"]


def test_systemd_units_run_migrations_before_gunicorn():
    service = (ROOT / "deploy" / "collector.service").read_text()
    migrate = (ROOT / "deploy" / "collector-migrate.service").read_text()
    assert "Requires=collector-migrate.service" in service
    assert "gunicorn -c /opt/collector/deploy/gunicorn.conf.py collector.wsgi:app" in service
    assert "ExecStart=/opt/collector/venv/bin/collector db upgrade" in migrate


def test_log_level_variable_reaches_collector_logs(database):
    server = ServerProcess(
        [sys.executable, "-m", "gunicorn", "-c", "deploy/gunicorn.conf.py", "collector.wsgi:app"],
        child_env(COLLECTOR_DATABASE_URL=database.url, COLLECTOR_PORT="0", COLLECTOR_WORKERS="1",
                  COLLECTOR_LOG_LEVEL="warning"),
    )
    try:
        body = {"status": "workers", "updated_at": "2025-01-26T10:35:00Z"}
        assert requests.put(server.url + "/api/jobs/loglevel-1", json=body, timeout=5).status_code == 200
    finally:
        server.stop()
    # gunicorn's own INFO lines announced the bind before the level applied to workers;
    # the collector's per-transition INFO line must be gone.
    assert "job loglevel-1 -> workers" not in server.output
    assert "/api/jobs/loglevel-1\" 200" in server.output  # collector.access keeps its own level


def test_prune_timer_runs_the_prune_unit_with_the_collector_environment(database):
    database.clean()  # the session database: an earlier module may have left finished jobs
    service = (ROOT / "deploy" / "collector-prune.service").read_text()
    timer = (ROOT / "deploy" / "collector-prune.timer").read_text()
    assert "EnvironmentFile=/etc/collector/collector.env" in service
    assert "OnCalendar=*-*-* 03:15:00" in timer and "WantedBy=timers.target" in timer
    # The unit's command line is one this collector accepts.
    exec_start = next(line for line in service.splitlines() if line.startswith("ExecStart="))
    program, *args = exec_start.removeprefix("ExecStart=").split()
    assert program == "/opt/collector/venv/bin/collector"
    result = run(collector_command(*args, "--dry-run", "--db", database.url), child_env())
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("would remove 0 jobs finished before ")


def test_probe_timer_runs_one_probe_with_the_probe_environment(api, tmp_path):
    service = (ROOT / "deploy" / "collector-probe.service").read_text()
    timer = (ROOT / "deploy" / "collector-probe.timer").read_text()
    assert "EnvironmentFile=/etc/collector/probe.env" in service
    assert "OnUnitActiveSec=60s" in timer and "WantedBy=timers.target" in timer
    example = dict(line.split("=", 1) for line in (ROOT / "deploy" / "probe.env.example").read_text().splitlines()
                   if line and not line.startswith("#"))
    assert sorted(example) == ["COLLECTOR_ENDPOINTS", "SRTCTL_STATUS_TOKEN"]
    # The unit's command line, with the environment file's variables, reports to a live collector.
    # A PATH without Slurm's tools gives the same outcome on every machine.
    exec_start = next(line for line in service.splitlines() if line.startswith("ExecStart="))
    program, *args = exec_start.removeprefix("ExecStart=").split()
    assert program == "/opt/collector/venv/bin/collector"
    interval = args[args.index("--interval") + 1]
    assert f"OnUnitActiveSec={interval}s" in timer  # else the collector calls the probe silent
    env = child_env(COLLECTOR_ENDPOINTS=api.url, SRTCTL_STATUS_TOKEN=api.token, PATH=str(tmp_path))
    result = run(collector_command(*args), env)
    assert (result.returncode, result.stdout) == (0, "b200: unavailable (sinfo: command not found)\n"), result.stderr
    state = api.get("/api/clusters/b200/status").json()
    assert (state["status"], state["detail"], state["probe_silent"]) == (
        "unavailable", "sinfo: command not found", False)


def test_systemd_units_pass_systemd_analyze_verify(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("needs systemd-analyze (Debian package systemd; .ci/run installs it)")
    # verify checks that each ExecStart program exists: point them at this interpreter's scripts.
    scripts = sysconfig.get_path("scripts")
    units = []
    for source in sorted((ROOT / "deploy").glob("collector*.[st]*")):
        if source.suffix not in (".service", ".timer"):
            continue
        unit = tmp_path / source.name
        unit.write_text(source.read_text().replace("/opt/collector/venv/bin/", scripts + "/"))
        units.append(str(unit))
    assert [Path(u).name for u in units] == ["collector-migrate.service", "collector-probe.service",
                                             "collector-probe.timer", "collector-prune.service",
                                             "collector-prune.timer", "collector.service"]
    result = subprocess.run([analyze, "verify", *units], capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stderr) == (0, "")
