"""Event ids on PostgreSQL: the writing transaction's id, and the horizon readers stop at.

Writers commit in parallel, so ids cannot be drawn from a sequence: a writer could draw
a smaller id than one already committed, and a poller past the larger id would miss it
forever. Instead an event's id is its transaction's id (``pg_current_xact_id()``, 64
bits, never reused) plus a fixed shift (the column default ``collector_event_id()``), and
a feed reader returns only ids below the **horizon** ``collector_feed_horizon()``: the
oldest transaction still running when its snapshot was taken, shifted the same way.
Every transaction below the horizon has finished; every one still running, or yet to
start, gets an id at or above it. So a reader past id N never later finds an event at or
below N, and feed order is id order. A transaction appends at most one event (the
primary key refuses a second).

Per-job reads need no horizon: a job's writers take its lock before their first write,
so a later writer's transaction id, and so its event id, is larger than an earlier one's.

The cost: the feed waits while any write transaction runs, on any database of the
PostgreSQL cluster (a long prune batch, a psql session left open after a write).
``oldest_writer_age`` measures it for /metrics; docs/operations.md has the limit.

SQLite keeps AUTOINCREMENT: BEGIN IMMEDIATE admits one writer at a time, so ids commit
in order and the horizon is not needed.
"""

from __future__ import annotations

from sqlalchemy import ColumnElement
from sqlalchemy import Connection
from sqlalchemy import func
from sqlalchemy import text

from collector.store.identity import is_postgres

# Below this, every event id has committed (or never will): the feed's readers' bound.
HORIZON: ColumnElement[int] = func.collector_feed_horizon()

_CHECK = text(
    "SELECT coalesce((SELECT max(id) FROM job_events), 0) AS newest, "
    "pg_snapshot_xmin(pg_current_snapshot())::text::bigint AS oldest, "
    "pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS next, "
    "(SELECT shift FROM event_id_shift) AS shift"
)
_OLDEST_WRITER = text(
    "SELECT coalesce(extract(epoch FROM max(clock_timestamp() - xact_start)), 0) "
    "FROM pg_stat_activity WHERE backend_xid IS NOT NULL"
)


def horizon(conn: Connection) -> int | None:
    """The feed horizon now (None on SQLite, where every committed id is readable)."""
    if not is_postgres(conn):
        return None
    return int(conn.execute(text("SELECT collector_feed_horizon()")).scalar_one())


def below_horizon(conn: Connection, column: ColumnElement[int]) -> ColumnElement[bool] | None:
    """The condition a feed query adds on PostgreSQL (None on SQLite)."""
    return column < HORIZON if is_postgres(conn) else None


def settle(conn: Connection) -> int | None:
    """Raise the shift when stored ids are not below every new one; returns the new shift, else None.

    A restore into a new PostgreSQL cluster brings the events back but not the
    transaction counter, which starts low again: new ids would fall below stored ones
    and feed cursors would skip them. Run by ``collector db upgrade`` and at server
    start; a no-op (one indexed max) when the ids are in order.
    """
    if not is_postgres(conn):
        return None
    row = conn.execute(_CHECK).one()
    if row.newest < row.next + row.shift:
        return None
    # No writer may draw an id with the old shift once readers may see the new one.
    conn.execute(text("LOCK TABLE job_events IN SHARE ROW EXCLUSIVE MODE"))
    row = conn.execute(_CHECK).one()
    if row.newest < row.next + row.shift:
        return None
    # Above the newest stored id from the oldest running transaction on.
    shift = int(row.newest - row.oldest + 1)
    conn.execute(text("UPDATE event_id_shift SET shift = :shift"), {"shift": shift})
    return shift


def oldest_writer_age(conn: Connection) -> float:
    """Seconds the oldest running write transaction has held the feed back (0 on SQLite or when none)."""
    if not is_postgres(conn):
        return 0.0
    return float(conn.execute(_OLDEST_WRITER).scalar_one())
