"""gunicorn in every mode: the options deploy/gunicorn.conf.py and `collector serve` share.

One server, one set of behaviours: `collector serve` runs gunicorn in-process
(:class:`CollectorServer`) with the same options the deployment config loads, so what
the tests prove of one holds for the other. Nothing here imports Flask or
prometheus_client at module level: the metrics directory must be chosen first.
"""

from __future__ import annotations

import gc
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING
from typing import Any
from typing import Protocol
from typing import TypeVar

from gunicorn import glogging
from gunicorn.app.base import BaseApplication

from collector import per_process
from collector.log_format import TEXT_FORMAT
from collector.settings import Settings

if TYPE_CHECKING:
    from flask import Flask

METRICS_DIR = "PROMETHEUS_MULTIPROC_DIR"
OWN_METRICS_DIR = "_COLLECTOR_OWN_METRICS_DIR"
# gunicorn's lines carry the pid: several workers write to one stream.
GUNICORN_TEXT_FORMAT = "%(asctime)s [%(process)d] %(levelname)s %(name)s: %(message)s"
log = logging.getLogger("collector")
T = TypeVar("T")


# gunicorn ships no type information: what the hooks below use of its objects.
class GunicornWorker(Protocol):
    """A gunicorn worker (gunicorn.workers.base.Worker)."""

    alive: bool
    pid: int
    wsgi: object  # the application the worker loaded


class GunicornListener(Protocol):
    """One of the master's bound sockets (gunicorn.sock.BaseSocket)."""

    sock: socket.socket


class GunicornArbiter(Protocol):
    """The gunicorn master (gunicorn.arbiter.Arbiter)."""

    LISTENERS: list[GunicornListener]


class ServerLogger(glogging.Logger):  # type: ignore[misc]  # gunicorn has no types
    """gunicorn's logger without its access line (collector.access writes one per request).

    With a logging config gunicorn formats every request's access fields before the
    level check drops the line: a measurable share of a write's CPU (docs/performance.md).
    """

    def access(self, *_: object) -> None:
        """Nothing: collector.access has already logged the request."""


def use_metrics_dir() -> None:
    """Put Prometheus in multiprocess mode, in a directory of this master's unless one is named.

    prometheus_client picks its mode when first imported, from this variable: call this
    before anything imports collector.app. Every worker writes its metrics to files there
    and a scrape, whichever worker answers it, adds them up. A reload (SIGHUP) finds the
    variable set and keeps the same files.
    """
    if not os.environ.get(METRICS_DIR):
        os.environ[METRICS_DIR] = os.environ[OWN_METRICS_DIR] = tempfile.mkdtemp(prefix="collector-metrics-")
    os.makedirs(os.environ[METRICS_DIR], exist_ok=True)


def bind_address(host: str, port: int) -> str:
    """gunicorn's bind string (IPv6 addresses bracketed)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def options(settings: Settings, *, text_format: str = GUNICORN_TEXT_FORMAT, server_log_level: str = "info",
            ) -> dict[str, Any]:
    """Every gunicorn setting the collector uses, from ``settings``; also trims this process's log records.

    The trim (``lean_log_records``) is process-wide and inherited by the workers it forks.
    """
    # Threads, not async: each request is a short transaction. An event stream holds its
    # thread for its whole life, so every worker gets max_streams threads on top of the
    # ones requests use; the app refuses a stream past that number (503), so streams can
    # never take the threads writes need. The app runs at most request_threads ordinary
    # requests at once (collector/admission.py), so stream threads add no GIL contention.
    threads = settings.request_threads + settings.max_streams
    lean_log_records()
    return {
        "bind": [bind_address(settings.host, settings.port)],
        "worker_class": "gthread",
        "workers": settings.worker_count,
        "threads": threads,
        # Connections a worker accepts: every stream and thread busy, plus idle keep-alives.
        "worker_connections": threads + 1000,
        # Reporters open a fresh connection per request; keep-alive only helps dashboards.
        "keepalive": settings.keepalive_s,
        "timeout": settings.worker_timeout_s,
        "graceful_timeout": settings.graceful_timeout_s,
        # A log file's relative path may be PATH_MAX (4096) bytes and percent-encoding triples
        # it: gunicorn's 4094-byte request line would refuse such an upload with a 414. 0 is
        # "no line limit" and gunicorn still caps the line at 1 MiB, the body limit.
        "limit_request_line": 0,
        # Recycle workers now and then so a slow leak can never take the service down.
        "max_requests": settings.max_requests,
        "max_requests_jitter": settings.max_requests // 10,
        # Each worker builds its own app, engine and pool after the fork (sockets shared
        # across a fork corrupt each other).
        "preload_app": False,
        # collector.access logs each request with its request id; gunicorn's line would repeat it.
        "accesslog": None,
        "logger_class": ServerLogger,
        "errorlog": "-",
        "loglevel": settings.server_log_level or server_log_level,
        "proc_name": "collector",
        "logconfig_dict": logging_config(settings, text_format, settings.server_log_level or server_log_level),
        "on_starting": _starting(settings),
        "post_worker_init": post_worker_init,
        "child_exit": child_exit,
        "on_exit": on_exit,
    }


def lean_log_records() -> None:
    """Leave out of every log record what no collector format prints: the caller's file and line, the thread.

    The switches of the logging HOWTO's "Optimization" table. Finding the caller walks the
    stack on every line, and a PUT logs its transition: 1.5% of a PUT's instructions
    (docs/performance.md). Formats with %(pathname)s, %(lineno)d or %(threadName)s then
    print placeholders; the process id, which the text format prints, is kept.
    """
    logging._srcfile = None
    logging.logThreads = False
    logging.logMultiprocessing = False


def logging_config(settings: Settings, text_format: str, server_level: str) -> dict[str, Any]:
    """dictConfig for gunicorn's lines and the collector's, in COLLECTOR_LOG_FORMAT."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "plain": {"format": text_format},
            "json": {"()": "collector.log_format.JsonFormatter"},
        },
        # Stamps each line logged while a request is handled with its id (None otherwise).
        "filters": {"request_id": {"()": "collector.log_format.RequestIdFilter"}},
        "handlers": {
            "stderr": {"class": "logging.StreamHandler", "formatter": "json" if settings.log_format == "json" else
                       "plain", "filters": ["request_id"], "stream": "ext://sys.stderr"},
        },
        "root": {"level": "WARNING", "handlers": ["stderr"]},
        "loggers": {
            "collector": {"level": settings.log_level.upper(), "handlers": ["stderr"], "propagate": False},
            "collector.access": {"level": settings.access_log_level.upper()},
            "gunicorn.error": {"level": server_level.upper(), "handlers": ["stderr"], "propagate": False},
            "gunicorn.access": {"level": "WARNING", "handlers": ["stderr"], "propagate": False},
        },
    }


def post_worker_init(worker: GunicornWorker) -> None:
    """Start the worker's background threads; end its streams as soon as it starts to stop, so it stops within seconds.

    A worker stops on SIGTERM, on max_requests and when its parent dies; in every case
    it clears ``worker.alive`` and then waits up to graceful_timeout for open requests,
    which a stream would use up. Closed streams tell clients to resume elsewhere.
    """
    extensions = getattr(worker.wsgi, "extensions", {})
    hub = extensions.get("collector.streams")
    if hub is None:  # another app on this config (bench/baseline_app.py): nothing to stop
        return
    # Background threads run from a worker's start, not from its first request: a
    # replacement for a dead stale-job sweeper must take over, and webhook deliveries left
    # pending by a restart must go, even if no traffic comes.
    per_process.start_all(extensions)
    # Read the tokens file now, so a worker that starts while it is broken says so at once.
    extensions["collector.keyring"].refresh()

    def watch() -> None:
        while worker.alive:
            time.sleep(0.2)
        hub.close()

    threading.Thread(target=watch, name="collector-stop-streams", daemon=True).start()


def _starting(settings: Settings) -> Callable[[GunicornArbiter | None], None]:
    def starting(server: GunicornArbiter | None) -> None:
        # In the master, once (a reload does not run it): a tokens file no worker could use
        # stops the start, with gunicorn's "Error: ..." line; later, workers keep serving.
        from collector.credentials import check_file

        try:
            check_file(settings)
        except ValueError as exc:
            raise RuntimeError(str(exc)) from None
        on_starting(server)

    return starting


def on_starting(server: GunicornArbiter | None) -> None:
    """Empty the metrics directory before the first worker starts.

    Files of an earlier run would add to this one's counters (and the master's own,
    written when it imported collector, are of no process that serves). Here and not at
    load: a reload loads the config again while the workers' files are live.
    """
    directory = os.environ.get(METRICS_DIR)
    if not directory:
        return
    for name in os.listdir(directory):
        if name.endswith(".db"):
            os.unlink(os.path.join(directory, name))


def child_exit(server: GunicornArbiter | None, worker: GunicornWorker) -> None:
    """Drop a dead worker's live gauges (its open streams, its pool) from the totals; its counters stay."""
    from prometheus_client import multiprocess

    if os.environ.get(METRICS_DIR):
        multiprocess.mark_process_dead(worker.pid)  # type: ignore[no-untyped-call]  # unannotated upstream


def on_exit(server: GunicornArbiter | None) -> None:
    """Remove the metrics directory if this master made it."""
    if os.environ.get(OWN_METRICS_DIR) and os.environ.get(OWN_METRICS_DIR) == os.environ.get(METRICS_DIR):
        shutil.rmtree(os.environ[METRICS_DIR], ignore_errors=True)


class CollectorServer(BaseApplication):  # type: ignore[misc]  # gunicorn has no types: its base class is Any
    """gunicorn run in this process by `collector serve`, with the deployment's options."""

    def __init__(self, settings: Settings, *, when_ready: Callable[[GunicornArbiter], None] | None = None,
                 on_stop: Callable[[], None] | None = None) -> None:
        self.settings = settings
        self._when_ready = when_ready
        self._on_stop = on_stop
        super().__init__()

    def load_config(self) -> None:
        """Apply the shared options, plus serve's own startup and shutdown lines."""
        config = options(self.settings, text_format=TEXT_FORMAT, server_log_level="warning")
        config["when_ready"] = self._ready
        config["on_exit"] = self._exit
        for key, value in config.items():
            self.cfg.set(key, value)

    def _ready(self, server: GunicornArbiter) -> None:
        if self._when_ready is not None:
            self._when_ready(server)

    def _exit(self, server: GunicornArbiter) -> None:
        if self._on_stop is not None:
            self._on_stop()
        on_exit(server)

    def load(self) -> Flask:
        """The app, built in each worker after the fork from serve's settings (flags included)."""
        from collector.app import create_app

        return frozen(create_app(self.settings))


def frozen(app: T) -> T:
    """``app``, with everything built so far moved out of the garbage collector's view.

    Modules, the app and compiled statements live as long as the process: frozen, full GC
    passes (which stall every thread of the worker) take microseconds, not tens of ms.
    """
    gc.collect()
    gc.freeze()
    return app


def listening_port(server: GunicornArbiter) -> int:
    """The port gunicorn bound (``--port 0`` picks one)."""
    port: int = server.LISTENERS[0].sock.getsockname()[1]
    return port
