"""Real collector processes (`collector serve`, gunicorn) on ephemeral ports, stopped by PID."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
_LISTENING = re.compile(r"(?:listening on|Listening at:) http://([\d.]+):(\d+)")


class ServerProcess:
    """A child process serving the collector; its output goes to a file read for assertions.

    A file, not a pipe: nothing in this process has to keep reading it, so a benchmark's
    server logs cost the machine no more than they would in production.
    """

    def __init__(self, args: list[str], env: dict[str, str], *, cwd: Path = ROOT, timeout: float = 30,
                 health_path: str = "/api/health") -> None:
        self.health_path = health_path
        # Kept open for the child to write to; stop() closes it, a finalizer removes it.
        self._log = tempfile.NamedTemporaryFile(prefix="collector-server-", suffix=".log", delete=False)  # noqa: SIM115
        weakref.finalize(self, os.unlink, self._log.name)
        self.proc = subprocess.Popen(
            args, env=env, cwd=cwd, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        url: str | None = None
        while url is None:
            match = _LISTENING.search(self.output)
            if match:
                url = f"http://{match.group(1)}:{match.group(2)}"
            elif self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{' '.join(args[-3:])} did not start listening:\n{self.output}")
            else:
                time.sleep(0.05)
        self.url = url
        self._wait_healthy(timeout)

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if requests.get(self.url + self.health_path, timeout=2).status_code == 200:
                    return
            except (requests.ConnectionError, requests.Timeout):
                pass  # not listening yet, or a worker still booting on a loaded machine
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"server never became healthy:\n{self.output}")

    @property
    def output(self) -> str:
        return Path(self._log.name).read_text(errors="replace")

    @property
    def lines(self) -> list[str]:
        return self.output.splitlines(keepends=True)

    def stop(self) -> int:
        """SIGTERM the process group, wait, then SIGKILL; returns the exit code."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        self._log.close()
        return self.proc.returncode


def child_env(**extra: str) -> dict[str, str]:
    """The test process's environment without collector/srtctl/Prometheus settings, plus ``extra``."""
    # A shared PROMETHEUS_MULTIPROC_DIR would mix the metrics of every server started.
    prefixes = ("COLLECTOR_", "SRTCTL_", "PROMETHEUS_", "_COLLECTOR_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    env.update(extra)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def collector_command(*args: str) -> list[str]:
    """``collector ARGS`` run with this interpreter (no reliance on PATH)."""
    return [sys.executable, "-c", "from collector.cli import main; main()", *args]


def run(args: list[str], env: dict[str, str], *, cwd: Path = ROOT, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run a command to completion and capture its output."""
    return subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def workers_of(master: int) -> list[int]:
    """The live (not zombie) children of ``master``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == master and fields[0] != "Z":
            pids.append(int(entry.name))
    return sorted(pids)
