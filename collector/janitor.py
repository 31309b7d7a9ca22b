"""The janitor: marks stale jobs failed every few seconds (collector/store/stale.py), in one process at a time.

Every serving process runs a janitor thread, but only the one holding the sweeper lock
(collector/sweeper.py) sweeps; the others try to take the lock each interval, so when
the sweeper dies another one takes over within one interval.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import os
import threading
from collections.abc import Callable

from flask import Flask

from collector import fanout
from collector import metrics
from collector import sweeper
from collector.credentials import Keyring
from collector.db import Database
from collector.per_process import PerProcess
from collector.per_process import keep_running
from collector.settings import Settings
from collector.store import credential_uses
from collector.store import stale

log = logging.getLogger("collector.stale")
# What time it is for the sweep: the wall clock in UTC, or a test's fake one.
Clock = Callable[[], dt.datetime]


def utc_now() -> dt.datetime:
    """The wall clock, in UTC."""
    return dt.datetime.now(dt.UTC)


@dataclasses.dataclass(frozen=True)
class Sweep:
    """What one sweep saw: the moment it swept at, the jobs stale then, and how many of them it marked."""

    at: dt.datetime
    candidates: tuple[stale.Candidate, ...]
    marked: int


class Janitor:
    """Runs the stale-job sweep in the process that serves while it is the sweeper, until the server shuts down."""

    def __init__(self, database: Database, settings: Settings, hub: fanout.Hub, clock: Clock = utc_now,
                 keyring: Keyring | None = None) -> None:
        self.database = database
        # Whose uses to write down each interval (``collector token list`` shows them).
        self.keyring = keyring
        self.settings = settings
        self.hub = hub
        # Read by every sweep not given its moment (the periodic ones); replaceable until the first request.
        self.clock = clock
        # How many sweeps finished, and the newest: a check that nothing was marked can first
        # make sure a sweep looked.
        self.sweeps = 0
        self.last_sweep: Sweep | None = None
        self._swept_lock = threading.Lock()
        self.leadership = sweeper.leadership(database)
        self.leading = False
        self.thread = PerProcess("collector-janitor", self._run)
        # lead() runs in the janitor thread; resign() also at shutdown, from another one.
        self._role_lock = threading.Lock()

    def ensure_running(self) -> None:
        """Start the janitor thread in this process if it is not running (cheap; every request calls it)."""
        self.thread.ensure_running()

    def _run(self) -> None:
        try:
            while not self.hub.closed:
                if self.lead():
                    self._sweep_logged()
                self.write_uses()
                self._pause()
        finally:
            self.write_uses()
            self.resign("the server is shutting down")

    def write_uses(self) -> None:
        """Write down when this process last saw each credential used (every process, every interval)."""
        if self.keyring is None:
            return
        uses = self.keyring.take_uses()
        if not uses:
            return
        stamped = {name: dt.datetime.fromtimestamp(at, dt.UTC) for name, at in uses.items()}
        try:
            self.database.run(lambda conn: credential_uses.record(conn, stamped), write=True)
        except Exception:  # noqa: BLE001 - a lost "last used" is no reason to end the thread
            log.warning("cannot write down credential uses", exc_info=True)

    def _sweep_logged(self) -> None:
        try:
            self.sweep()
        except Exception:  # noqa: BLE001 - the next sweep retries; a database outage must not end the thread
            log.warning("stale-job sweep failed; retrying in %g s", self.settings.stale_check_s, exc_info=True)

    def _pause(self) -> None:
        # Woken by shutdown: the role must be given up at once, not an interval later.
        self.hub.wait_closed(self.settings.stale_check_s)

    def lead(self) -> bool:
        """Keep the sweeper role, or take it if no process holds it; whether this janitor leads now."""
        with self._role_lock:
            return self._lead()

    def _lead(self) -> bool:
        held = self._hold()
        if self.leading and not held:
            # Its connection died (a database restart, a terminated backend): another
            # process may lead already, or the lock may be free again.
            self._stepped_down("its lock was lost")
            held = self._hold()
        if held and not self.leading:
            self.leading = True
            metrics.sweeper_leader(True)
            log.info("this process (pid %d) is now the stale-job sweeper", os.getpid())
        return held

    def _hold(self) -> bool:
        try:
            return self.leadership.hold()
        except Exception:  # noqa: BLE001 - never end the thread; the next interval tries again
            log.warning("cannot take the stale-job sweeper lock", exc_info=True)
            return False

    def resign(self, reason: str) -> None:
        """Give the sweeper role up so another process takes it at its next try."""
        with self._role_lock:
            if self.leading:
                # The gauge first: the next holder's 1 must not be overwritten by this 0.
                self._stepped_down(reason)
            self.leadership.release()

    def _stepped_down(self, reason: str) -> None:
        self.leading = False
        metrics.sweeper_leader(False)
        log.info("this process (pid %d) is no longer the stale-job sweeper: %s", os.getpid(), reason)

    def sweep(self, now: dt.datetime | None = None) -> Sweep:
        """Mark every job stale at ``now`` (default: the janitor's clock) failed; what the sweep saw and did."""
        # Not only the sweeper calls this: a cluster's probe report sweeps at once in the
        # process that took it (collector/api/clusters.py), and tests call it directly.
        # That is safe, as stale.mark re-checks each job under its write lock.
        at = self.clock() if now is None else now
        settings = self.settings
        found = self.database.run(lambda conn: stale.candidates(
            conn, at, grace_s=settings.stale_grace_s, silence_s=settings.stale_silence_s))
        marked = 0
        for candidate in found:
            if self._mark(candidate, at):
                marked += 1
        if marked:
            self.hub.poke()
        done = Sweep(at, tuple(found), marked)
        with self._swept_lock:
            self.sweeps += 1
            self.last_sweep = done
        return done

    def _mark(self, candidate: stale.Candidate, now: dt.datetime) -> bool:
        # One transaction per job: a sweep never holds one job's lock while waiting for another's.
        result = self.database.run(lambda conn: stale.mark(conn, candidate, now), write=True)
        if result is None or result.event is None:
            return False
        metrics.event_appended()
        metrics.stale_marked(candidate.rule)
        log.info("job %s%s marked failed: %s", f"{result.cluster}/" if result.cluster else "",
                 result.job_id, candidate.message)
        return True


def init_app(app: Flask, database: Database, settings: Settings) -> None:
    """Give ``app`` a janitor, started in each process at its first request (at boot under gunicorn)."""
    janitor = Janitor(database, settings, fanout.get_hub(app), keyring=app.extensions["collector.keyring"])
    app.extensions["collector.janitor"] = janitor
    keep_running(app, janitor.thread)


def get_janitor(app: Flask) -> Janitor:
    """The janitor of ``app``."""
    janitor: Janitor = app.extensions["collector.janitor"]
    return janitor
