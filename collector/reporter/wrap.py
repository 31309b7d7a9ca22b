"""``collector wrap``: run a command inside a batch job and report its whole lifecycle.

Started is reported first; the command's stdout and stderr are copied to the job's own
stdout and stderr and into ``wrap-<job id>.out`` (in ``--log-dir``, else a private temporary
directory), which is streamed with the rest of ``--log-dir``; at the end the log is flushed
(at most 5 s) and completed or failed is reported with the exit code. SIGTERM (``scancel``, a
time limit) and SIGINT are forwarded to the command; the job is then reported failed and
exits 128 + the signal number. Reporting never changes the exit code.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from types import FrameType
from typing import BinaryIO

from collector.reporter.client import Client
from collector.reporter.client import unacknowledged

# How long the command gets to exit after a forwarded signal before it is killed: inside
# Slurm's KillWait (30 s by default), leaving time for the final flush and report.
SIGNAL_GRACE = 10.0
# Output pipes can outlive the command (a background child keeps them open): wait this long.
DRAIN_TIMEOUT = 2.0
FORWARDED = (signal.SIGTERM, signal.SIGINT)


def exit_code_of(returncode: int) -> int:
    """A shell-style exit code: a command killed by signal N exits 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def _tee(source: BinaryIO, console: BinaryIO, log: BinaryIO, lock: threading.Lock) -> None:
    # os.read returns what is there, so output reaches the console and the log as it is written.
    fd = source.fileno()
    while True:
        data = os.read(fd, 65536)
        if not data:
            break
        with lock:
            for out in (console, log):
                try:
                    out.write(data)
                    out.flush()
                except (OSError, ValueError):
                    pass  # a closed console (or log) must not stop the other copy


class _Signals:
    """Remembers the first SIGTERM/SIGINT and passes each one on to the command."""

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.received: int | None = None
        self.child: subprocess.Popen[bytes] | None = None
        self._killer: threading.Timer | None = None
        self._previous = {s: signal.signal(s, self._handle) for s in FORWARDED}

    def attach(self, child: subprocess.Popen[bytes]) -> None:
        """Forward to ``child`` from now on (and the signal that came while it was starting)."""
        self.child = child
        if self.received is not None:
            self._forward(self.received)

    def restore(self) -> None:
        """Put the previous handlers back; the command has ended."""
        if self._killer is not None:
            self._killer.cancel()
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signum
        self._forward(signum)

    def _forward(self, signum: int) -> None:
        child = self.child
        if child is None or child.poll() is not None:
            return
        child.send_signal(signum)
        if self._killer is None:
            # The command may ignore it: end it after the grace, well inside Slurm's KillWait.
            self._killer = threading.Timer(self.grace, _kill, args=(child,))
            self._killer.daemon = True
            self._killer.start()


def _kill(child: subprocess.Popen[bytes]) -> None:
    if child.poll() is None:
        child.kill()


def _start(command: list[str], log_file: BinaryIO) -> tuple[subprocess.Popen[bytes], list[threading.Thread]]:
    child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lock = threading.Lock()
    readers = [threading.Thread(target=_tee, args=(pipe, console, log_file, lock), daemon=True)
               for pipe, console in ((child.stdout, sys.stdout.buffer), (child.stderr, sys.stderr.buffer))]
    for reader in readers:
        reader.start()
    return child, readers


def run(client: Client, command: list[str], *, log_dir: str | None, outbox: str | None, interval: float,
        job_name: str | None, signal_grace: float = SIGNAL_GRACE) -> int:
    """Run ``command`` with its lifecycle reported; returns the exit code the job should end with."""
    reporter = client.reporter()
    signals = _Signals(signal_grace)
    private: str | None
    if log_dir:
        private, directory = None, log_dir
    else:
        private = directory = tempfile.mkdtemp(prefix=f"collector-wrap-{client.job_id}-")
    os.makedirs(directory, exist_ok=True)
    head = socket.gethostname()
    if not reporter.report_started(job_name=job_name, head_node=head,
                                   log_dir=os.path.abspath(log_dir) if log_dir else None):
        unacknowledged("the started report")
    streamer = client.streamer(directory, outbox, interval).start()
    try:
        with open(os.path.join(directory, f"wrap-{client.job_id}.out"), "ab") as log_file:
            code, message = _supervise(command, log_file, signals)
        if not streamer.stop():
            unacknowledged("the final log flush")
        if not reporter.report_completed(code, message=message):
            unacknowledged("the final report")
    finally:
        signals.restore()
        if private:
            shutil.rmtree(private, ignore_errors=True)
    return code


def _supervise(command: list[str], log_file: BinaryIO, signals: _Signals) -> tuple[int, str | None]:
    """Run the command to its end: (exit code, message for the final report, None for the default)."""
    if signals.received is not None:  # cancelled before the command even started
        return 128 + signals.received, _cancelled(signals.received, None)
    try:
        child, readers = _start(command, log_file)
    except OSError as exc:
        text = f"collector wrap: cannot run {command[0]!r}: {exc.strerror or exc}\n"
        sys.stderr.write(text)
        log_file.write(text.encode())
        return 127, f"Job failed: cannot run {command[0]!r}: {exc.strerror or exc} (exit code 127)"
    signals.attach(child)
    # A blocking wait: a signal runs its handler (which forwards it) and the wait goes on.
    returncode = child.wait()
    for reader in readers:
        reader.join(DRAIN_TIMEOUT)
    if signals.received is not None:
        return 128 + signals.received, _cancelled(signals.received, returncode)
    return exit_code_of(returncode), None


def _cancelled(signum: int, returncode: int | None) -> str:
    name = signal.Signals(signum).name
    cause = "scancel or the time limit" if signum == signal.SIGTERM else "interrupted"
    after = "" if returncode is None else f"; the command exited with code {exit_code_of(returncode)}"
    return f"Job cancelled ({name}, {cause}){after}; exit code {128 + signum}"
