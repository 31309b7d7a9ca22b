"""Fan-out of committed events to the open streams of this process.

One ``Hub`` per app, i.e. per process. Its thread is the only reader of the live feed:
it wakes on a PostgreSQL NOTIFY (one LISTEN connection per process, never one per
client) or, on SQLite, polls; it reads every event after its cursor through the pool,
formats each once, and wakes the streams, which hold no database connection. A
notification only says "read now" (its payload, the newest event id the sender
committed, lets a burst be read once): the cursor is the truth, so a lost notification
or a dropped listener costs latency, never an event.

Writers do not NOTIFY in their own transactions (NOTIFY's cluster-wide lock would
serialise their commits, store/pg_driver.py). A process's writes poke its hub, which
reads them and announces them to the other processes in one NOTIFY per batch window.
A notified event may still be above the feed horizon (an older transaction is still
running, store/event_ids.py): the hub re-reads every batch window until its cursor
reaches the id or the horizon passes it.

Streams keep their own cursors and take what they have not sent from an in-memory tail
of the feed. One that falls behind the tail (or resumes from an old id) reads its gap
from the database a page at a time, then rejoins the tail: nothing is queued per
stream, so a slow client only slows itself.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Iterator
from operator import attrgetter

import psycopg
from flask import Flask
from flask import current_app

from collector import metrics
from collector.contract import StreamEvent
from collector.db import Database
from collector.settings import Settings
from collector.store import event_ids
from collector.store import streams as stream_store
from collector.store.pg_driver import EVENT_CHANNEL

log = logging.getLogger("collector.streams")

TAIL = 4096  # events kept in memory; a stream further behind reads the database
PAGE = 500
# After a read, the next waits this long: a burst of commits becomes one read and one
# wake-up per stream, which bounds the fan-out's cost by time, not by the write rate.
BATCH_WINDOW = 0.1
# Concurrent gap reads per process: a crowd of resuming streams queues here instead of
# taking every pooled connection from the writers.
GAP_READERS = 2
# How long the LISTEN connection may stay silent before it is checked and the feed read
# anyway; a half-open TCP connection would otherwise hide lost notifications for good.
LISTEN_CHECK_S = 15.0
# While a long transaction holds the feed horizon below an announced event, the hub
# re-reads every batch window, then after this many reads every HELD_WAIT seconds.
HELD_READS = 20
HELD_WAIT = 1.0
# How often the listening thread also looks for this process's own writes to read and announce.
_WAIT_TICK = 0.05
_id = attrgetter("id")

HEARTBEAT = b"event: heartbeat\ndata: {}\n\n"


class Unavailable(Exception):
    """The stream cannot start: the process holds its maximum, or the feed is unreadable."""


@dataclasses.dataclass(frozen=True, slots=True)
class Entry:
    """One event of the tail: what filters look at, and its frame, formatted once."""

    id: int
    job_pk: int
    job_id: str
    cluster: str | None
    status: str
    frame: bytes


def entry(job_pk: int, event: StreamEvent) -> Entry:
    """The tail entry of ``event``: an SSE ``job-event`` whose id is the event id."""
    frame = b"id: %d\nevent: job-event\ndata: %s\n\n" % (event.id, event.model_dump_json().encode())
    return Entry(event.id, job_pk, event.job_id, event.cluster, event.status, frame)


@dataclasses.dataclass(frozen=True)
class Filter:
    """Which events a stream sends; None matches anything."""

    job_pk: int | None = None
    job_id: str | None = None
    cluster: str | None = None
    status: str | None = None

    def matches(self, item: Entry) -> bool:
        """Whether ``item`` belongs on the stream."""
        return (
            (self.job_pk is None or item.job_pk == self.job_pk)
            and (self.job_id is None or item.job_id == self.job_id)
            and (self.cluster is None or item.cluster == self.cluster)
            and (self.status is None or item.status == self.status)
        )


class Hub:
    """This process's view of the live feed, shared by all its streams."""

    def __init__(self, database: Database, settings: Settings) -> None:
        self.database = database
        self.settings = settings
        self._changed = threading.Condition()
        self._tail: list[Entry] = []
        # Every event with floor < id <= cursor is in the tail; ids at or below floor
        # may have left it (or predate the hub) and are read from the database.
        self.cursor = 0
        self.floor = 0
        self._ready = False
        self._closed = False
        self._poked = threading.Event()
        self._committed = 0  # the newest event id this process committed and has not announced
        self._thread: threading.Thread | None = None
        self._failures = 0  # consecutive failures of the reader, for back-off and logging
        self._start_lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(settings.max_streams) if settings.max_streams > 0 else None
        self._gap_readers = threading.BoundedSemaphore(GAP_READERS)
        self._count_lock = threading.Lock()
        self.open_streams = 0

    # -- lifecycle ---------------------------------------------------------------

    def _start(self) -> None:
        with self._start_lock:
            if self._thread is None and not self._closed:
                # Started by the first stream, so it runs in the process that serves it
                # (gunicorn forks workers; a thread started before the fork would not be).
                self._thread = threading.Thread(target=self._run, name="collector-feed", daemon=True)
                self._thread.start()

    def close(self) -> None:
        """End every open stream and stop reading the feed (shutdown)."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        self._poked.set()

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds, after close(), for the feed reader to end; whether it has (or never ran)."""
        thread = self._thread
        if thread is None:
            return True
        thread.join(timeout)
        return not thread.is_alive()

    def wait_closed(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for close(); whether the hub is closed."""
        with self._changed:
            return self._changed.wait_for(lambda: self._closed, timeout)

    @property
    def closed(self) -> bool:
        """Whether the server is shutting down (close() was called)."""
        return self._closed

    def poke(self, event_id: int | None = None) -> None:
        """Read the feed now: this process just committed an event (``event_id`` when known)."""
        if event_id is not None:
            with self._count_lock:
                self._committed = max(self._committed, event_id)
        if not self.settings.is_sqlite:
            # Other processes hear of this write only through this hub's announcement.
            self._start()
        self._poked.set()

    def _take_committed(self) -> int | None:
        """The newest id committed here since the last call (0 if none is known); None without a poke."""
        if not self._poked.is_set():
            return None
        self._poked.clear()
        with self._count_lock:
            committed, self._committed = self._committed, 0
        return committed

    # -- what streams call -------------------------------------------------------

    def acquire(self) -> None:
        """Take a stream slot, or raise Unavailable when the process holds its maximum."""
        if self._slots is None or not self._slots.acquire(blocking=False):
            raise Unavailable(f"this server process holds its maximum of {self.settings.max_streams} streams")
        with self._count_lock:
            self.open_streams += 1
        metrics.stream_opened()

    def release(self) -> None:
        """Give a stream slot back."""
        with self._count_lock:
            self.open_streams -= 1
        metrics.stream_closed()
        assert self._slots is not None  # released only after acquire() took a slot
        self._slots.release()

    def live_edge(self, timeout: float = 10.0) -> int:
        """The newest event id this process has read: where a stream without a cursor starts."""
        self._start()
        if not self._ready and self.settings.is_sqlite:
            self._poked.set()  # the poll loop starts reading now, not at its next poll
        with self._changed:
            if not self._changed.wait_for(lambda: self._ready or self._closed, timeout):
                raise Unavailable("the event feed could not be read; see the server log")
            return self.cursor

    def wait(self, cursor: int, timeout: float) -> list[Entry] | None:
        """Tail entries after ``cursor``, waiting up to ``timeout`` s for one; None means read the gap."""
        self._start()
        with self._changed:
            self._changed.wait_for(lambda: self._closed or (self._ready and self.cursor > cursor), timeout)
            if self._closed:
                raise EOFError("the server is shutting down")
            if not self._ready or cursor >= self.cursor:
                return []
            if cursor < self.floor:
                return None
            return self._tail[bisect.bisect_right(self._tail, cursor, key=_id):]

    def read_gap(self, cursor: int, where: Filter) -> tuple[list[Entry], int]:
        """The next page of matching events after ``cursor`` from the database, and the new cursor."""
        with self._gap_readers:
            # Every event up to what the hub has read is committed (the feed never
            # skips), so a short page means nothing else up to there can match.
            known = self.cursor
            rows = self.database.run(
                lambda conn: stream_store.page(conn, after=cursor, limit=PAGE, **dataclasses.asdict(where))
            )
        items = [entry(job_pk, event) for job_pk, event in rows]
        last = items[-1].id if items else cursor
        return items, (last if len(items) == PAGE else max(last, known))

    # -- the reader thread -------------------------------------------------------

    def _run(self) -> None:
        while not self._closed:
            try:
                if self.settings.is_sqlite:
                    self._poll()
                else:
                    self._listen()
            except Exception as exc:  # noqa: BLE001 - the thread must outlive any outage
                self._failures += 1
                if self._failures == 1:
                    log.warning("event feed reader failed (%s); retrying, streams poll meanwhile", _first_line(exc))
                # Retry at once (a terminated listener reconnects in milliseconds), then
                # back off; meanwhile streams still get what a poll of the feed finds.
                self._poll_for(min(0.5 * 2 ** (self._failures - 2), 5.0) if self._failures > 1 else 0)

    def _poll_for(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self._closed and time.monotonic() < deadline:
            # The database is down too; the caller logged it.
            with contextlib.suppress(Exception):
                self._refresh()
            self._poked.wait(min(self.settings.stream_poll_s, max(deadline - time.monotonic(), 0)))
            self._poked.clear()

    def _poll(self) -> None:
        while not self._closed:
            self._refresh()
            self._failures = 0
            if self._poked.wait(self.settings.stream_poll_s):
                self._poked.clear()
                time.sleep(BATCH_WINDOW)

    def _listen(self) -> None:
        with self._listener() as conn:
            conn.execute(f"LISTEN {EVENT_CHANNEL}")
            if self._failures:
                log.info("event listener reconnected after %d failed attempt(s)", self._failures)
                self._failures = 0
            own = conn.info.backend_pid
            # LISTEN first, then read: whatever committed before it took effect is read
            # now, whatever commits after it is announced.
            self._refresh()
            quiet = 0.0
            pending = 0  # the newest id some process committed, until the cursor or horizon passes it
            held = 0  # reads in a row that stopped short of it (a long transaction holds the horizon)
            while not self._closed:
                heard = [_event_id(n.payload) for n in conn.notifies(timeout=_WAIT_TICK, stop_after=1)
                         if n.pid != own]
                committed = self._take_committed()
                pending = max(pending, committed or 0, *(i for i in heard if i is not None))
                if heard or committed is not None or pending > self.cursor:
                    time.sleep(BATCH_WINDOW if held < HELD_READS else HELD_WAIT)
                    later = self._take_committed()
                    if committed is not None or later is not None:
                        # One NOTIFY for every write of the window, after they committed.
                        newest = max(committed or 0, later or 0)
                        conn.execute("SELECT pg_notify(%s, %s)", (EVENT_CHANNEL, str(newest)))
                        pending = max(pending, newest)
                    self._refresh()
                    if not self._ready:
                        pending = 0  # no stream to read for: announcing was all there was to do
                    elif pending > self.cursor and self._settled_past(pending):
                        pending = 0  # deleted since it was announced: nothing to wait for
                    held = held + 1 if pending > self.cursor else 0
                    quiet = 0.0
                    continue
                if not self._ready and self.open_streams:
                    self._refresh()  # a stream is waiting for the hub to start reading
                quiet += _WAIT_TICK
                if quiet >= LISTEN_CHECK_S:
                    conn.execute("SELECT 1")
                    self._refresh()
                    quiet = 0.0

    def _settled_past(self, event_id: int) -> bool:
        horizon = self.database.run(event_ids.horizon)
        return horizon is None or horizon > event_id

    def _listener(self) -> psycopg.Connection:
        engine = self.database.engine
        args, kwargs = engine.dialect.create_connect_args(engine.url)
        # Keepalives: a listener behind a dead network path must fail, not wait forever.
        conn = psycopg.connect(*args, **kwargs, autocommit=True, connect_timeout=5, keepalives=1,
                               keepalives_idle=30, keepalives_interval=10, keepalives_count=3,
                               application_name="collector-listener")
        # An announcement is a hint: its commit need not wait for the disk.
        conn.execute("SET synchronous_commit = off")
        return conn

    def _refresh(self) -> None:
        if self._ready and not self.open_streams:
            # Nobody to read for: forget the tail rather than format every event. The next
            # stream's live_edge waits for a fresh start (the listen loop sees it within
            # a tick); a stream resuming from an id reads its gap from the database.
            with self._changed:
                self._ready = False
                self._tail.clear()
            return
        if not self._ready and not self.open_streams:
            return
        if not self._ready:
            newest = self.database.run(stream_store.newest_id)
            with self._changed:
                self.cursor = self.floor = newest
                self._ready = True
                self._changed.notify_all()
            return
        while not self._closed:
            rows = self.database.run(lambda conn: stream_store.page(conn, after=self.cursor, limit=PAGE))
            if rows:
                self._publish([entry(job_pk, event) for job_pk, event in rows])
            if len(rows) < PAGE:
                return

    def _publish(self, items: list[Entry]) -> None:
        with self._changed:
            self._tail.extend(items)
            self.cursor = items[-1].id
            if len(self._tail) > 2 * TAIL:
                # Trimmed in halves, not per event: amortised O(1) and a list bisect can search.
                self.floor = self._tail[-TAIL - 1].id
                del self._tail[:-TAIL]
            self._changed.notify_all()


def _event_id(payload: str) -> int | None:
    # Anything but an id (someone else's NOTIFY on the channel) is a reason to read once, not to fail.
    return int(payload) if payload.isascii() and payload.isdigit() else None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def frames(hub: Hub, cursor: int, where: Filter, settings: Settings, *, lifetime: float) -> Iterator[bytes]:
    """The body of one stream: events after ``cursor``, heartbeats when idle, until ``lifetime`` s."""
    heartbeat = settings.stream_heartbeat_s
    # The first bytes flush the headers through every proxy; retry: asks EventSource to
    # come back after a second rather than its default few.
    yield b"retry: 1000\n: collector event stream\n\n"
    end = time.monotonic() + lifetime
    sent = time.monotonic()
    while True:
        now = time.monotonic()
        if now >= end:
            yield b": maximum stream lifetime reached; reconnect with Last-Event-ID\n\n"
            return
        try:
            batch = hub.wait(cursor, min(end, sent + heartbeat) - now)
        except EOFError:
            yield b": server shutting down; reconnect with Last-Event-ID\n\n"
            return
        if batch is None:
            items, cursor = hub.read_gap(cursor, where)
        else:
            items = [item for item in batch if where.matches(item)]
            cursor = batch[-1].id if batch else cursor
        if items:
            yield b"".join(item.frame for item in items)
            sent = time.monotonic()
        elif time.monotonic() - sent >= heartbeat:
            yield HEARTBEAT
            sent = time.monotonic()


def init_app(app: Flask, database: Database, settings: Settings) -> None:
    """Give ``app`` its hub (started by the first stream)."""
    app.extensions["collector.streams"] = Hub(database, settings)


def get_hub(app: Flask | None = None) -> Hub:
    """The hub of ``app`` (default: the current app)."""
    hub: Hub = (app or current_app).extensions["collector.streams"]
    return hub
