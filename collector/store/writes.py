"""Persisting a job write: the row, its event and its count, in as few round trips as we can.

SQLite runs them as separate statements (one writer at a time, no network), handed to
the sqlite3 connection itself (store/sqlite_driver.py). PostgreSQL gets one statement
for all three (pg_driver.SAVE_EXISTING, or SAVE_NEW_JOB for a job not stored yet),
because on a shared collector the per-statement cost is most of what a lifecycle PUT
costs, and takes no lock beyond the job's and its count rows', so writers of different
jobs commit together.
"""

from __future__ import annotations

import datetime as dt
import random
from typing import Any

from psycopg.types.json import Jsonb
from sqlalchemy import Connection

from collector.contract import JobEventRecord
from collector.contract import JobUpdatePayload
from collector.store import counts
from collector.store import events
from collector.store import pg_driver
from collector.store import sqlite_driver
from collector.store.identity import JOB_LOCK
from collector.store.identity import JobRow
from collector.store.identity import is_postgres

Triple = tuple[str, str | None, str | None]


def save(
    conn: Connection,
    row: JobRow,
    original: JobRow | None,
    before: Triple | None,
    created_at: dt.datetime,
    *,
    commit: bool = False,
    credential: str | None = None,
) -> JobEventRecord | None:
    """Write ``row`` (inserting it when ``original`` is None), its event and its count.

    The event is appended iff (status, stage, message) differs from ``before`` (None for
    a new row). ``commit`` says nothing follows in this transaction: PostgreSQL then gets
    the COMMIT in the same round trip (pg_driver.execute_and_commit); SQLite leaves it to
    the caller as usual. ``credential`` names who wrote it, on the event.
    """
    if is_postgres(conn):
        return _save_postgres(conn, row, original, before, created_at, commit, credential)
    if original is None:
        row["id"] = sqlite_driver.insert_job(conn, row)
    return _save_sqlite(conn, row, original, before, created_at, credential)


def insert_new_job(conn: Connection, row: JobRow, created_at: dt.datetime, *,
                   credential: str | None = None) -> JobEventRecord | None:
    """Take the job id's lock and insert ``row`` with its first event and count, then commit: one round trip.

    Unless a row the write would land on exists: then it commits having changed nothing
    and returns None, and the caller takes the general path (``identity.find_for_write``).
    PostgreSQL only: a POST at submit time nearly always makes a new job.
    """
    key = (row["cluster"], row["status"])
    params = {**pg_driver.row_params(row), "created_at": created_at, "credential": credential,
              "namespace": JOB_LOCK, "old_cluster": key[0], "old_status": key[1], "old_delta": 0,
              "new_cluster": key[0], "new_status": key[1], "new_delta": 1, "stripe": random.randrange(counts.STRIPES)}
    _, rows = pg_driver.execute_all(conn, [pg_driver.Query(pg_driver.LOCK_JOB_ID, params),
                                           pg_driver.Query(pg_driver.SAVE_NEW_JOB_IF_ABSENT, params)], commit=True)
    if not rows:
        return None
    row["id"] = rows[0]["job_pk"]
    return events.record(row, rows[0]["id"], created_at, credential)


# Revisions 0016 and 0017: the PUT applied in the statement, when it lands on its job's own
# row in order or the job has no row at all (its placeholder).
PUT_JOB = pg_driver.statement("collector_put_job", (
    "SELECT * FROM collector_put_job(%(namespace)s::integer, %(job_id)s::text, %(cluster)s::text, "
    "%(status)s::text, %(stage)s::text, %(message)s::text, %(started_at)s::timestamptz, "
    "%(completed_at)s::timestamptz, %(exit_code)s::integer, %(logs_url)s::text, %(benchmark_results)s::jsonb, "
    "%(artifacts)s::jsonb, %(metadata)s::jsonb, %(reported_name)s::text, %(updated_at)s::timestamptz, "
    "%(received_at)s::timestamptz, %(credential)s::text, %(stripe)s::smallint)"))


def put_stored(conn: Connection, job_id: str, cluster: str | None, payload: JobUpdatePayload,
               reported_name: str | None, received_at: dt.datetime, *,
               credential: str | None = None) -> tuple[JobRow, JobEventRecord | None] | None:
    """Apply a PUT to its job's own row, or make its placeholder, in one round trip with COMMIT (PostgreSQL).

    None, having changed nothing, for a late PUT, a cluster-less row to claim or rows to
    choose among: then the caller applies it the general way (``jobs.update``). Otherwise
    the row's identity and report as they now stand, and the event if one was appended.
    """
    def json(value: dict[str, Any] | None) -> Jsonb | None:
        return None if value is None else Jsonb(value)

    applied = pg_driver.execute_and_commit(conn, PUT_JOB, {
        "namespace": JOB_LOCK, "job_id": job_id, "cluster": cluster or "", "status": payload.status.value,
        "stage": payload.stage.value if payload.stage is not None else None, "message": payload.message,
        "started_at": payload.started_at, "completed_at": payload.completed_at, "exit_code": payload.exit_code,
        "logs_url": payload.logs_url, "benchmark_results": json(payload.benchmark_results),
        "artifacts": json(payload.artifacts), "metadata": json(payload.metadata), "reported_name": reported_name,
        "updated_at": payload.updated_at, "received_at": received_at, "credential": credential,
        "stripe": random.randrange(counts.STRIPES)})
    if not applied:
        return None
    found = applied[0]
    row = {"id": found["job_pk"], "job_id": job_id, "cluster": found["cluster"], "status": found["status"],
           "stage": found["stage"], "message": found["message"]}
    event = found["event_id"]
    return row, None if event is None else events.record(row, event, payload.updated_at, credential)


def _save_sqlite(conn: Connection, row: JobRow, original: JobRow | None, before: Triple | None,
                 created_at: dt.datetime, credential: str | None) -> JobEventRecord | None:
    if original is not None:
        changes = {key: value for key, value in row.items() if value != original[key]}
        if changes:
            sqlite_driver.update_job(conn, row["id"], changes)
    event = events.append_if_changed(conn, row, before, created_at, credential)
    counts.move(conn, _count_key(original), _count_key(row))
    return event


def _save_postgres(conn: Connection, row: JobRow, original: JobRow | None, before: Triple | None,
                   created_at: dt.datetime, commit: bool, credential: str | None) -> JobEventRecord | None:
    old_key, new_key = _count_key(original), (row["cluster"], row["status"])
    moved = old_key != new_key
    params = {
        **pg_driver.row_params(row),
        "created_at": created_at,
        "credential": credential,
        # Zero deltas are filtered out: a new row has no old count, an unmoved one neither.
        "old_cluster": (old_key or new_key)[0],
        "old_status": (old_key or new_key)[1],
        "old_delta": -1 if moved and old_key is not None else 0,
        "new_cluster": new_key[0],
        "new_status": new_key[1],
        "new_delta": 1 if moved else 0,
        "stripe": random.randrange(counts.STRIPES),
    }
    execute = pg_driver.execute_and_commit if commit else pg_driver.execute
    if original is None:
        # A new row always has an event (there is no "before"), sent with the row itself.
        (event,) = execute(conn, pg_driver.SAVE_NEW_JOB, params)
        row["id"] = event["job_pk"]
        return events.record(row, event["id"], created_at, credential)
    params.update(pk=row["id"], changed=row != original)
    appends = before != (row["status"], row["stage"], row["message"])
    rows = execute(conn, pg_driver.SAVE_EXISTING[appends, moved], params)
    return events.record(row, rows[0]["id"], created_at, credential) if appends else None


def _count_key(row: JobRow | None) -> counts.Key | None:
    return None if row is None else (row["cluster"], row["status"])
