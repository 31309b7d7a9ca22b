"""The deployment kit: the gunicorn config loads with the settings the environment gives it."""

from __future__ import annotations

import runpy

from tests.processes import ROOT

CONFIG = ROOT / "deploy" / "gunicorn.conf.py"


def test_gunicorn_config_reads_collector_variables(monkeypatch):
    monkeypatch.setenv("COLLECTOR_HOST", "::1")
    monkeypatch.setenv("COLLECTOR_PORT", "9123")
    monkeypatch.setenv("COLLECTOR_WORKERS", "3")
    monkeypatch.setenv("COLLECTOR_THREADS", "16")
    config = runpy.run_path(str(CONFIG))
    assert config["bind"] == ["[::1]:9123"]
    assert (config["workers"], config["threads"], config["worker_class"]) == (3, 16, "gthread")
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
