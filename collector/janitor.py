"""The per-process janitor: marks stale jobs failed every few seconds (collector/store/stale.py)."""

from __future__ import annotations

import datetime as dt
import logging
import os
import threading

from flask import Flask

from collector import fanout
from collector import metrics
from collector.db import Database
from collector.settings import Settings
from collector.store import stale

log = logging.getLogger("collector.stale")


class Janitor:
    """Runs the stale-job sweep in the process that serves, until the server shuts down."""

    def __init__(self, database: Database, settings: Settings, hub: fanout.Hub) -> None:
        self.database = database
        self.settings = settings
        self.hub = hub
        self._pid: int | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()

    def ensure_running(self) -> None:
        """Start the sweeping thread in this process if it is not running (cheap; every request calls it)."""
        if self._pid == os.getpid():
            return
        with self._lock:
            # After gunicorn forks, a thread started in the parent does not exist here.
            if self._pid != os.getpid():
                self._pid = os.getpid()
                threading.Thread(target=self._run, name="collector-janitor", daemon=True).start()

    def _run(self) -> None:
        while not self.hub.closed:
            try:
                self.sweep()
            except Exception:  # noqa: BLE001 - the next sweep retries; a database outage must not end the thread
                log.warning("stale-job sweep failed; retrying in %g s", self.settings.stale_check_s, exc_info=True)
            self._wake.wait(self.settings.stale_check_s)
            self._wake.clear()

    def sweep(self, now: dt.datetime | None = None) -> int:
        """Mark every job stale at ``now`` failed; returns how many were marked."""
        now = now or dt.datetime.now(dt.timezone.utc)
        settings = self.settings
        found = self.database.run(lambda conn: stale.candidates(
            conn, now, grace_s=settings.stale_grace_s, silence_s=settings.stale_silence_s))
        marked = 0
        for candidate in found:
            # One transaction per job: a sweep never holds one job's lock while waiting for another's.
            result = self.database.run(lambda conn: stale.mark(conn, candidate, now), write=True)
            if result is not None and result.event is not None:
                marked += 1
                metrics.event_appended()
                metrics.stale_marked(candidate.rule)
                log.info("job %s%s marked failed: %s", f"{result.cluster}/" if result.cluster else "",
                         result.job_id, candidate.message)
        if marked:
            self.hub.poke()
        return marked


def init_app(app: Flask, database: Database, settings: Settings) -> None:
    """Give ``app`` a janitor, started by the first request each process serves."""
    janitor = Janitor(database, settings, fanout.get_hub(app))
    app.extensions["collector.janitor"] = janitor
    app.before_request(janitor.ensure_running)


def get_janitor(app: Flask) -> Janitor:
    """The janitor of ``app``."""
    return app.extensions["collector.janitor"]
