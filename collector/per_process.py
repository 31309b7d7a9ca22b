"""Background threads that run once in each serving process, whichever process that is."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from collections.abc import Mapping
from typing import Any

from flask import Flask

_pid = os.getpid()


def _forked() -> None:
    global _pid  # noqa: PLW0603 - the one process-wide value this module keeps
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)


def pid() -> int:
    """This process's id without a system call: read once, and again in each forked child.

    Asked on every request (which process started a thread) and on every metric update
    (prometheus_client's check for a fork); os.getpid is a system call each time.
    """
    return _pid


class PerProcess:
    """Runs ``target`` on a daemon thread the first time ``ensure_running`` is called in each process.

    After gunicorn forks a worker, a thread started in the parent does not exist in it:
    the pid tells which process last started it.
    """

    def __init__(self, name: str, target: Callable[[], None]) -> None:
        self.name = name
        self.target = target
        self._pid: int | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def ensure_running(self) -> None:
        """Start the thread in this process if it is not running (cheap: every request may call it)."""
        if self._pid == pid():
            return
        with self._lock:
            if self._pid != pid():
                self._pid = pid()
                self._thread = threading.Thread(target=self.target, name=self.name, daemon=True)
                self._thread.start()

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for this process's thread to end; whether it has (or never started).

        The target must have been told to stop first (the app's hub closed).
        """
        thread = self._thread
        if thread is None or self._pid != pid():
            return True
        thread.join(timeout)
        return not thread.is_alive()


def keep_running(app: Flask, runner: PerProcess) -> None:
    """Have each process of ``app`` start ``runner`` at its first request, and gunicorn's workers at boot.

    One request hook serves every such thread: the write path pays for one call, however
    many background threads there are.
    """
    runners: list[PerProcess] = app.extensions.setdefault("collector.per_process", [])
    if not runners:
        app.before_request(lambda: start_all(app.extensions))
    runners.append(runner)


def start_all(extensions: Mapping[str, Any]) -> None:
    """Make sure every background thread of the app (by its ``extensions``) runs in this process."""
    for runner in extensions.get("collector.per_process", ()):
        runner.ensure_running()


def join_all(extensions: Mapping[str, Any], timeout: float) -> list[str]:
    """Wait for the app's background threads here to end (its hub closed first); the names of any still running.

    Their last statements (a janitor giving up its role, a dispatcher recording answers)
    are done when this returns an empty list.
    """
    deadline = time.monotonic() + timeout
    return [runner.name for runner in extensions.get("collector.per_process", ())
            if not runner.join(max(deadline - time.monotonic(), 0))]
