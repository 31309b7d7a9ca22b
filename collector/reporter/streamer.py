"""LogStreamer: new log bytes and sealed capture segments, pushed every N seconds to every endpoint.

Logs: new bytes of ``.out .err .log .csv .jsonl`` files under a directory (recursive) go to
``POST /api/jobs/{id}/logs?file=<relative path>&offset=<n>[&final=1][&cluster=]`` in chunks of
at most 1 MiB; a chunk is resent verbatim until an endpoint acknowledges it (200, the same
``job_id``, ``stored`` 0 or 1), and offsets are kept per endpoint, so a slow or down endpoint
never holds the others back. ``stop()`` does a last pass with ``final=1``, bounded to 5 s.

Captures: see :class:`collector.reporter.outbox.Outbox`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading

from collector.reporter.chunks import CHUNK_BYTES
from collector.reporter.chunks import Deadline
from collector.reporter.chunks import read_chunk
from collector.reporter.outbox import Outbox
from collector.reporter.transport import Transport

log = logging.getLogger("collector.reporter")

LOG_SUFFIXES = (".out", ".err", ".log", ".csv", ".jsonl")
FINAL_TIMEOUT = 5.0


@dataclasses.dataclass(frozen=True)
class _Chunk:
    offset: int
    data: bytes
    final: bool


def log_files(root: str) -> dict[str, str]:
    """Streamable files under ``root``: relative name (``/``-separated) to path."""
    found = {}
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            if not name.endswith(LOG_SUFFIXES):
                continue
            path = os.path.join(folder, name)
            relative = os.path.relpath(path, root).replace(os.sep, "/")
            # The collector refuses backslashes and control characters in names: skip, do not resend forever.
            if "\\" in relative or any(ord(ch) < 0x20 or ch == "\x7f" for ch in relative):
                continue
            found[relative] = path
    return found


class LogStreamer:
    """Streams one job's log directory (and optionally a capture outbox) from a background thread."""

    def __init__(self, transport: Transport, job_id: str, log_dir: str | None, *, cluster: str | None = None,
                 interval: float = 10.0, outbox: str | None = None, chunk_bytes: int = CHUNK_BYTES,
                 final_timeout: float = FINAL_TIMEOUT) -> None:
        self.transport = transport
        self.job_id = str(job_id)
        self.log_dir = log_dir
        self.cluster = cluster or None
        self.interval = interval
        self.chunk_bytes = min(chunk_bytes, CHUNK_BYTES)
        self.final_timeout = final_timeout
        self.outbox = Outbox(transport, self.job_id, outbox, cluster=self.cluster,
                             chunk_bytes=self.chunk_bytes) if outbox else None
        # Per endpoint: acknowledged offset, the chunk awaiting its acknowledgement, finished files.
        self.acked: dict[str, dict[str, int]] = {e: {} for e in transport.endpoints}
        self._pending: dict[str, dict[str, _Chunk]] = {e: {} for e in transport.endpoints}
        self.finalized: dict[str, set[str]] = {e: set() for e in transport.endpoints}
        self._stopping = threading.Event()
        self._deadline = Deadline()
        self._thread: threading.Thread | None = None
        self._final_ok = False

    def start(self) -> LogStreamer:
        """Start the background thread (one pass every ``interval`` seconds)."""
        self._thread = threading.Thread(target=self._run, name="collector-log-streamer", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> bool:
        """Stop the thread after a final pass with ``final=1``; returns within ``final_timeout`` seconds.

        True when the final pass finished and every endpoint acknowledged everything.
        """
        # Moved, not replaced: a pass already running sees it too and starts nothing after it.
        self._deadline.reset(self.final_timeout)
        if self._thread is None:
            return self.flush(final=True, deadline=self._deadline)
        self._stopping.set()
        self._thread.join(self._deadline.left())
        # A thread still running is stuck in a request past the deadline; it is a daemon and
        # starts nothing new, so the job is not held back by it.
        return not self._thread.is_alive() and self._final_ok

    def _run(self) -> None:
        while not self._stopping.wait(self.interval):
            self._guarded(final=False)
        self._final_ok = self._guarded(final=True)

    def _guarded(self, *, final: bool) -> bool:
        try:
            return self.flush(final=final, deadline=self._deadline)
        except Exception:  # noqa: BLE001 - a bug here must never end the job
            log.exception("log streaming pass failed")
            return False

    def flush(self, *, final: bool = False, deadline: Deadline | None = None) -> bool:
        """One pass over the logs, then the outbox; True when every endpoint holds everything seen."""
        deadline = deadline or Deadline()
        files = log_files(self.log_dir) if self.log_dir and os.path.isdir(self.log_dir) else {}
        ok = all([self._flush_endpoint(endpoint, files, final, deadline) for endpoint in self.transport.endpoints])
        if self.outbox is not None:
            ok = self.outbox.flush(deadline) and ok
        return ok

    def _flush_endpoint(self, endpoint: str, files: dict[str, str], final: bool, deadline: Deadline) -> bool:
        ok = True
        for name, path in files.items():
            if name in self.finalized[endpoint]:
                continue
            sent = self._flush_file(endpoint, name, path, final, deadline)
            if sent is None:
                return False  # the endpoint is down or refuses us: leave its other files for the next pass
            ok = ok and sent
        return ok

    def _flush_file(self, endpoint: str, name: str, path: str, final: bool, deadline: Deadline) -> bool | None:
        """Send what ``endpoint`` lacks of one file: True when acknowledged, False refused, None endpoint failed."""
        pending = self._pending[endpoint]
        while True:
            chunk = pending.get(name) or self._next_chunk(endpoint, name, path, final)
            if chunk is None:
                return True
            pending[name] = chunk
            if deadline.passed():
                return None
            params = {"file": name, "offset": chunk.offset}
            if chunk.final:
                params["final"] = 1
            if self.cluster:
                params["cluster"] = self.cluster
            outcome = self.transport.send_to(endpoint, "POST", f"/api/jobs/{self.job_id}/logs", params=params,
                                             data=chunk.data, timeout=deadline.left())
            body = outcome.body or {}
            if not (outcome.ok and body.get("job_id") == self.job_id and body.get("stored") in (0, 1)):
                # Kept in pending: the next pass resends exactly these bytes.
                return None if outcome.endpoint_failed else False
            del pending[name]
            self.acked[endpoint][name] = chunk.offset + len(chunk.data)
            if chunk.final:
                self.finalized[endpoint].add(name)
                return True

    def _next_chunk(self, endpoint: str, name: str, path: str, final: bool) -> _Chunk | None:
        offset = self.acked[endpoint].get(name, 0)
        try:
            size = os.path.getsize(path)
            data = read_chunk(path, offset, min(self.chunk_bytes, max(0, size - offset)))
        except OSError as exc:
            log.debug("cannot read %s: %s", path, exc)
            return None
        if size < offset:
            log.warning("%s shrank below the %d bytes already sent: logs must be append-only", path, offset)
            return None
        last = offset + len(data) >= size
        if not data and not final:
            return None
        # The final marker rides on the last chunk; an empty final chunk closes a file already sent.
        return _Chunk(offset, data, final and last)
