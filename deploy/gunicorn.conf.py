"""gunicorn settings for a shared collector, driven by ``COLLECTOR_*`` environment variables.

    gunicorn -c deploy/gunicorn.conf.py collector.wsgi:app

The bind address comes from COLLECTOR_HOST / COLLECTOR_PORT, the same variables the app
checks its auth rules against (no token is only allowed on loopback).
"""

import multiprocessing
import os
import threading
import time

from collector.settings import Settings

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
_streams = int(os.environ.get("COLLECTOR_MAX_STREAMS", Settings.max_streams))
threads = int(os.environ.get("COLLECTOR_THREADS", "8")) + _streams
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
    from collector.fanout import get_hub

    hub = get_hub(worker.wsgi)

    def watch():
        while worker.alive:
            time.sleep(0.2)
        hub.close()

    threading.Thread(target=watch, name="collector-stop-streams", daemon=True).start()

logconfig_dict = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s [%(process)d] %(levelname)s %(name)s: %(message)s"},
    },
    "handlers": {
        "stderr": {"class": "logging.StreamHandler", "formatter": "plain", "stream": "ext://sys.stderr"},
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
