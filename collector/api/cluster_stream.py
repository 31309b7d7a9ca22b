"""``GET /api/clusters/stream``: one ``cluster-status`` event per cluster at once, then one per change."""

from __future__ import annotations

import time
from collections.abc import Iterator

from flask import Blueprint
from flask import Flask
from flask import Response
from flask import current_app

from collector import fanout
from collector.api.streams import lifetime
from collector.api.streams import open_stream
from collector.api.streams import stream_response
from collector.cluster_snapshots import SNAPSHOT_AGE_S
from collector.cluster_snapshots import Snapshots
from collector.db import Database
from collector.openapi import EVENT_STREAM
from collector.openapi import operation
from collector.settings import Settings

bp = Blueprint("cluster_stream", __name__)
CLUSTER_SSE = {"type": "string", "description": "server-sent events: `cluster-status` frames (one cluster each, "
                                                "as GET /api/clusters lists it), heartbeats and comments"}


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
def cluster_events() -> Response:
    """Every cluster's state now, then again whenever it changes (health, counts, active jobs)."""
    hub = fanout.get_hub()
    cursor = open_stream(hub)
    snapshots: Snapshots = current_app.extensions["collector.cluster_snapshots"]
    body = frames(hub, cursor, snapshots, current_app.config["COLLECTOR_SETTINGS"], lifetime=lifetime())
    return stream_response(hub, body)


def init_app(app: Flask, database: Database) -> None:
    """Give ``app`` the shared snapshot its cluster streams read."""
    app.extensions["collector.cluster_snapshots"] = Snapshots(database)
