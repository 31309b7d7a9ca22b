"""``GET /api/clusters/stream``: one ``cluster-status`` event per cluster at once, then one per change."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Iterator

from flask import Blueprint
from flask import current_app

from collector import fanout
from collector.api.streams import lifetime
from collector.api.streams import open_stream
from collector.api.streams import stream_response
from collector.db import Database
from collector.openapi import EVENT_STREAM
from collector.openapi import operation
from collector.settings import Settings
from collector.store import clusters as cluster_store

bp = Blueprint("cluster_stream", __name__)
# How stale a shared snapshot may be. Probe reports arrive every ~30 s and carry no
# feed event, so streams re-read at this pace; job events wake them sooner.
SNAPSHOT_AGE_S = 1.0
CLUSTER_SSE = {"type": "string", "description": "server-sent events: `cluster-status` frames (one cluster each, "
                                                "as GET /api/clusters lists it), heartbeats and comments"}


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
                frames = {state.cluster: _frame(state.model_dump_json()) for state in states}
                if frames != self.frames:
                    self.frames, self.version = frames, self.version + 1
                self._read_at = time.monotonic()
            return self.version, self.frames


def _frame(data: str) -> bytes:
    return f"event: cluster-status\ndata: {data}\n\n".encode()


def frames(hub: fanout.Hub, cursor: int, snapshots: Snapshots, settings: Settings, *,
           lifetime: float) -> Iterator[bytes]:
    """The body of one cluster stream: every cluster now, then each one that changes, heartbeats when idle."""
    heartbeat = settings.stream_heartbeat_s
    yield b"retry: 1000\n: collector cluster stream\n\n"
    end = time.monotonic() + lifetime
    sent_at = time.monotonic()
    sent: dict[str | None, bytes] = {}
    seen_version = -1
    while True:
        version, current = snapshots.current()
        if version != seen_version:
            changed = [frame for name, frame in current.items() if sent.get(name) != frame]
            sent, seen_version = dict(current), version
            if changed:
                yield b"".join(changed)
                sent_at = time.monotonic()
        now = time.monotonic()
        if now >= end:
            yield b": maximum stream lifetime reached; reconnect\n\n"
            return
        if now - sent_at >= heartbeat:
            yield fanout.HEARTBEAT
            sent_at = now
        try:
            # A job event may change a cluster's active jobs: wake for one, or re-read on the snapshot's pace.
            batch = hub.wait(cursor, min(SNAPSHOT_AGE_S, end - now, sent_at + heartbeat - now))
        except EOFError:
            yield b": server shutting down; reconnect\n\n"
            return
        if batch:
            cursor = batch[-1].id
            # Let the burst that woke us settle: one re-read after it, not one per event.
            time.sleep(SNAPSHOT_AGE_S / 4)
        elif batch is None:
            cursor = hub.cursor  # fell behind the hub's tail: only newer events matter here


@bp.get("/api/clusters/stream")
@operation(responses={200: {EVENT_STREAM: CLUSTER_SSE}})
def cluster_events():
    """Every cluster's state now, then again whenever it changes (health, counts, active jobs)."""
    hub = fanout.get_hub()
    cursor = open_stream(hub)
    snapshots = current_app.extensions["collector.cluster_snapshots"]
    body = frames(hub, cursor, snapshots, current_app.config["COLLECTOR_SETTINGS"], lifetime=lifetime())
    return stream_response(hub, body)


def init_app(app, database: Database) -> None:
    """Give ``app`` the shared snapshot its cluster streams read."""
    app.extensions["collector.cluster_snapshots"] = Snapshots(database)
