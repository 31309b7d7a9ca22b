"""The process's shared snapshot of every cluster's state, as the cluster streams send it.

Process-wide state lives here, outside the HTTP views: ``collector/api/cluster_stream.py``
only reads it.
"""

from __future__ import annotations

import datetime as dt
import threading
import time

from collector.db import Database
from collector.store import clusters as cluster_store

# How stale a shared snapshot may be. Probe reports arrive every ~30 s and carry no
# feed event, so streams re-read at this pace; job events wake them sooner.
SNAPSHOT_AGE_S = 1.0


class Snapshots:
    """The clusters' state, read at most once per SNAPSHOT_AGE_S per process however many streams read it."""

    def __init__(self, database: Database) -> None:
        self.database = database
        self._lock = threading.Lock()
        self._read_at = float("-inf")
        self.version = 0
        self.frames: dict[str | None, bytes] = {}

    def current(self) -> tuple[int, dict[str | None, bytes]]:
        """The newest snapshot (version, one frame per cluster), re-read when older than SNAPSHOT_AGE_S."""
        with self._lock:
            if time.monotonic() - self._read_at >= SNAPSHOT_AGE_S:
                now = dt.datetime.now(dt.UTC)
                states = self.database.run(lambda conn: cluster_store.states(conn, now))
                frames = {state.cluster: frame(state.model_dump_json()) for state in states}
                if frames != self.frames:
                    self.frames, self.version = frames, self.version + 1
                self._read_at = time.monotonic()
            return self.version, self.frames


def frame(data: str) -> bytes:
    """One ``cluster-status`` server-sent event carrying ``data``."""
    return f"event: cluster-status\ndata: {data}\n\n".encode()
