"""gunicorn settings for a shared collector, driven by ``COLLECTOR_*`` environment variables.

    gunicorn -c deploy/gunicorn.conf.py collector.wsgi:app

The bind address comes from COLLECTOR_HOST / COLLECTOR_PORT, the same variables the app
checks its auth rules against (no token is only allowed on loopback).
"""

import logging
import multiprocessing
import os
import shutil
import tempfile
import threading
import time

# Prometheus multiprocess mode (docs/operations.md, "Metrics"): every worker writes its
# metrics to files in this directory, and a scrape, whichever worker answers it, adds
# them up. prometheus_client chooses the mode when it is first imported, and the import
# of collector below imports it (collector/__init__.py builds on collector.app), so the
# variable is set first, here; the workers inherit it. Unless the operator names one,
# each master gets a directory of its own, removed when it exits. A reload (SIGHUP)
# runs this file again and finds the variable set: its workers keep the same files.
_METRICS_DIR = "PROMETHEUS_MULTIPROC_DIR"
_OWN_METRICS_DIR = "_COLLECTOR_OWN_METRICS_DIR"
if not os.environ.get(_METRICS_DIR):
    os.environ[_METRICS_DIR] = os.environ[_OWN_METRICS_DIR] = tempfile.mkdtemp(prefix="collector-metrics-")
os.makedirs(os.environ[_METRICS_DIR], exist_ok=True)

from prometheus_client import multiprocess  # noqa: E402 - after the metrics directory is chosen
from collector.settings import Settings  # noqa: E402 - likewise

_host = os.environ.get("COLLECTOR_HOST", "127.0.0.1")
_port = os.environ.get("COLLECTOR_PORT", "8080")
bind = [f"[{_host}]:{_port}" if ":" in _host else f"{_host}:{_port}"]

# Threads, not async: each request is a short transaction, and a thread per open
# connection keeps fresh-connection reporters and keep-alive dashboards alike cheap.
# An event stream holds its thread for its whole life (up to the stream lifetime), so
# every worker gets COLLECTOR_MAX_STREAMS threads on top of the ones requests use; the
# app refuses a stream past that number (503), so streams can never take the threads
# writes need. A waiting stream costs its thread's stack and nothing else: it sleeps on
# a condition until the worker's feed reader wakes it (docs/operations.md, "Streams").
worker_class = "gthread"
workers = int(os.environ.get("COLLECTOR_WORKERS", multiprocessing.cpu_count() * 2))
# The app runs at most COLLECTOR_THREADS ordinary requests at once (collector/admission.py),
# so the stream threads cannot add GIL contention to writes.
_settings = Settings.from_env()
threads = _settings.request_threads + _settings.max_streams
# Connections a worker accepts: every stream and thread busy, plus idle keep-alives.
worker_connections = threads + 1000
# Reporters open a fresh connection per request; keep-alive only helps dashboards.
keepalive = int(os.environ.get("COLLECTOR_KEEPALIVE", "5"))
timeout = int(os.environ.get("COLLECTOR_WORKER_TIMEOUT", "60"))
graceful_timeout = int(os.environ.get("COLLECTOR_GRACEFUL_TIMEOUT", "30"))
# Recycle workers now and then so a slow leak can never take the service down.
max_requests = int(os.environ.get("COLLECTOR_MAX_REQUESTS", "20000"))
max_requests_jitter = max_requests // 10
# Each worker imports collector.wsgi itself, so every process builds its own engine
# and connection pool after the fork (sharing sockets across a fork corrupts them).
preload_app = False
# collector.access logs each request with its request id; gunicorn's own line would repeat it.
accesslog = None
errorlog = "-"
# gunicorn's own lines (boot, bind, worker deaths) stay at INFO; COLLECTOR_LOG_LEVEL
# sets the collector's (one line per lifecycle transition at INFO).
loglevel = os.environ.get("GUNICORN_LOG_LEVEL", "info")
collector_level = os.environ.get("COLLECTOR_LOG_LEVEL", "info").upper()
proc_name = "collector"


def post_worker_init(worker):
    """End the worker's streams as soon as it starts to stop, so it stops within seconds.

    A worker stops on SIGTERM, on max_requests and when its parent dies; in every case
    it clears ``worker.alive`` and then waits up to graceful_timeout for open requests,
    which a stream would use up. Closed streams tell clients to resume elsewhere.
    """
    hub = getattr(worker.wsgi, "extensions", {}).get("collector.streams")
    if hub is None:  # another app on this config (bench/baseline_app.py): nothing to stop
        return

    def watch():
        while worker.alive:
            time.sleep(0.2)
        hub.close()

    threading.Thread(target=watch, name="collector-stop-streams", daemon=True).start()


def on_starting(server):
    """Empty the metrics directory before the first worker starts.

    Files of an earlier run would add to this one's counters (and the master's own,
    written when this file imported collector, are of no process that serves). Here and
    not at load: a reload loads this file again while the workers' files are live.
    """
    directory = os.environ[_METRICS_DIR]
    for name in os.listdir(directory):
        if name.endswith(".db"):
            os.unlink(os.path.join(directory, name))


def child_exit(server, worker):
    """Drop a dead worker's live gauges (its open streams, its pool) from the totals; its counters stay."""
    multiprocess.mark_process_dead(worker.pid)


def on_exit(server):
    """Remove the metrics directory if this master made it."""
    if os.environ.get(_OWN_METRICS_DIR) == os.environ.get(_METRICS_DIR):
        shutil.rmtree(os.environ[_METRICS_DIR], ignore_errors=True)


logconfig_dict = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s [%(process)d] %(levelname)s %(name)s: %(message)s"},
        # COLLECTOR_LOG_FORMAT=json: gunicorn's lines and the collector's, one JSON object each.
        "json": {"()": "collector.log_format.JsonFormatter"},
    },
    # Stamps each line logged while a request is handled with its id (None otherwise).
    "filters": {"request_id": {"()": "collector.log_format.RequestIdFilter"}},
    "handlers": {
        "stderr": {"class": "logging.StreamHandler", "formatter": "json" if _settings.log_format == "json" else "plain",
                   "filters": ["request_id"], "stream": "ext://sys.stderr"},
    },
    "root": {"level": "WARNING", "handlers": ["stderr"]},
    "loggers": {
        "collector": {"level": collector_level, "handlers": ["stderr"], "propagate": False},
        # One line per request; set to "warning" to keep only the application log.
        "collector.access": {"level": os.environ.get("COLLECTOR_ACCESS_LOG_LEVEL", "info").upper()},
        "gunicorn.error": {"level": loglevel.upper(), "handlers": ["stderr"], "propagate": False},
        "gunicorn.access": {"level": "WARNING", "handlers": ["stderr"], "propagate": False},
    },
}
if _settings.log_format == "json":
    # A Python warning would otherwise print two plain lines among the JSON ones.
    logging.captureWarnings(True)
