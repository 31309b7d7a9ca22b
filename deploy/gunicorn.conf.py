"""gunicorn settings for a shared collector, driven by ``COLLECTOR_*`` environment variables.

    gunicorn -c deploy/gunicorn.conf.py collector.wsgi:app

The bind address comes from COLLECTOR_HOST / COLLECTOR_PORT, the same variables the app
checks its auth rules against (no token is only allowed on loopback).
"""

import multiprocessing
import os

_host = os.environ.get("COLLECTOR_HOST", "127.0.0.1")
_port = os.environ.get("COLLECTOR_PORT", "8080")
bind = [f"[{_host}]:{_port}" if ":" in _host else f"{_host}:{_port}"]

# Threads, not async: each request is a short transaction, and a thread per open
# connection keeps fresh-connection reporters and keep-alive dashboards alike cheap.
worker_class = "gthread"
workers = int(os.environ.get("COLLECTOR_WORKERS", multiprocessing.cpu_count() * 2))
threads = int(os.environ.get("COLLECTOR_THREADS", "8"))
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
