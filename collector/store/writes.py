"""Persisting a job write: the row, its event and its count, in as few round trips as we can.

SQLite runs them as separate statements (one writer at a time, no network). PostgreSQL
gets one statement for all three, because on a shared collector the per-statement cost
(a round trip plus driver and SQLAlchemy work) is most of what a lifecycle PUT costs.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import Connection
from sqlalchemy import bindparam
from sqlalchemy import insert
from sqlalchemy import text
from sqlalchemy import update

from collector.contract import JobEventRecord
from collector.models import UTCDateTime
from collector.store import counts
from collector.store import events
from collector.store.identity import FEED_LOCK
from collector.store.identity import JOBS
from collector.store.identity import JobRow
from collector.store.identity import is_postgres

Triple = tuple[str, str | None, str | None]

_INSERT_JOB = insert(JOBS).returning(JOBS.c.id)
_UPDATE_JOB = update(JOBS).where(JOBS.c.id == bindparam("pk"))

_MUTABLE = [c.name for c in JOBS.c if c.name != "id"]
_SET = ", ".join(f'"{name}" = :{name}' for name in _MUTABLE)
_TYPED = [bindparam(name, type_=JOBS.c[name].type) for name in _MUTABLE]
# The row's UPDATE (skipped when nothing changed), then, when the triple changed, the
# event under the feed lock (see events.py), then the count moves. The count upsert reads
# feed_lock, so its row locks come after the feed lock, in key order (ORDER BY): no two
# writers can then wait on each other.
_COUNTED = (
    "counted AS (INSERT INTO job_counts (cluster, status, jobs) "
    "SELECT v.cluster, v.status, v.delta FROM {source}"
    "(VALUES (:old_cluster, :old_status, :old_delta), (:new_cluster, :new_status, :new_delta)) "
    "AS v (cluster, status, delta) "
    "WHERE v.delta <> 0 ORDER BY v.cluster, v.status "
    "ON CONFLICT (cluster, status) DO UPDATE SET jobs = job_counts.jobs + excluded.jobs)"
)
_UPDATED = f"updated AS (UPDATE jobs SET {_SET} WHERE id = :pk AND :changed)"
_WITH_EVENT = text(
    f"WITH {_UPDATED}, "
    "feed_lock AS MATERIALIZED (SELECT pg_advisory_xact_lock(:feed_namespace, 0) AS locked), "
    "event AS (INSERT INTO job_events (job_pk, status, stage, message, created_at) "
    "SELECT :pk, :status, :stage, :message, :created_at FROM feed_lock RETURNING id), "
    + _COUNTED.format(source="feed_lock, ")
    + " SELECT id FROM event"
).bindparams(*_TYPED, bindparam("created_at", type_=UTCDateTime()))
_WITHOUT_EVENT = text(f"WITH {_UPDATED}, " + _COUNTED.format(source="") + " SELECT 1").bindparams(*_TYPED)


def save(
    conn: Connection, row: JobRow, original: JobRow | None, before: Triple | None, created_at: dt.datetime
) -> JobEventRecord | None:
    """Write ``row`` (inserting it when ``original`` is None), its event and its count.

    The event is appended iff (status, stage, message) differs from ``before`` (None for
    a new row). These are the last statements of the write: the caller commits next.
    """
    if original is None:
        row["id"] = conn.execute(_INSERT_JOB, row).scalar_one()
    if not is_postgres(conn):
        if original is not None:
            changes = {key: value for key, value in row.items() if value != original[key]}
            if changes:
                conn.execute(_UPDATE_JOB, {"pk": row["id"], **changes})
        event = events.append_if_changed(conn, row, before, created_at)
        counts.move(conn, _count_key(original), _count_key(row))
        return event

    old_key, new_key = _count_key(original), _count_key(row)
    moved = old_key != new_key
    params = {
        **{name: row[name] for name in _MUTABLE},
        "pk": row["id"],
        "changed": original is not None and any(row[k] != original[k] for k in _MUTABLE),
        "created_at": created_at,
        # Zero deltas are filtered out: a new row has no old count, an unmoved one neither.
        "old_cluster": (old_key or new_key)[0],
        "old_status": (old_key or new_key)[1],
        "old_delta": -1 if moved and old_key is not None else 0,
        "new_cluster": new_key[0],
        "new_status": new_key[1],
        "new_delta": 1 if moved else 0,
    }
    triple = (row["status"], row["stage"], row["message"])
    if before == triple:
        conn.execute(_WITHOUT_EVENT, params)
        return None
    event_id = conn.execute(_WITH_EVENT, {**params, "feed_namespace": FEED_LOCK}).scalar_one()
    return events.record(row, event_id, created_at)


def _count_key(row: JobRow | None) -> counts.Key | None:
    return None if row is None else (row["cluster"], row["status"])
