"""Seed N jobs with full lifecycles straight into the database (the API would take hours at 100k)."""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import json
import random
import sqlite3

import psycopg
from sqlalchemy import create_engine
from sqlalchemy import make_url

from bench import builtin_app
from collector.contract import format_timestamp
from collector.migrations import settle_event_ids

CLUSTERS = ("c0", "c1", "c2", "c3")
LIFECYCLE = [
    ("submitted", None, None),
    ("starting", "starting", "Job started on node-01"),
    ("starting", "head_infrastructure", "Starting head infrastructure"),
    ("workers", "workers", "Starting workers"),
    ("frontend", "frontend", "Starting frontend"),
    ("frontend", "frontend", "Inference endpoint ready"),
    ("benchmark", "benchmark", "Running benchmark"),
    ("benchmark", "cleanup", "Artifacts uploaded"),
    ("completed", "cleanup", "Benchmark completed successfully"),
]
BASE = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
METADATA = json.dumps({"model": {"path": "/models/dsr1", "precision": "fp4"}, "resources": {"gpu_type": "gb200",
                       "gpus_per_node": 4}, "benchmark": {"type": "sa-bench"}, "head_node": "node-01",
                       "tags": ["suite:nightly"]})


def rows(n: int, seed: int = 7):
    """Yield (job row, [event rows]) for n jobs: most complete, some fail, some still run."""
    rng = random.Random(seed)
    event_id = 0
    # Heard from now, on the collector's clock: the stale check leaves the seeded active
    # jobs alone for the whole run instead of failing them in batches mid-measurement.
    received = dt.datetime.now(dt.UTC)
    for i in range(n):
        cluster = CLUSTERS[i % len(CLUSTERS)]
        submitted = BASE + dt.timedelta(seconds=60 * i)
        roll = rng.random()
        steps = len(LIFECYCLE) if roll < 0.8 else rng.randint(1, len(LIFECYCLE) - 1)
        events = LIFECYCLE[:steps]
        if 0.8 <= roll < 0.9:
            events = [*events, ("failed", events[-1][1], "Job failed with exit code 1")]
        status, stage, message = events[-1]
        job = (i + 1, cluster, str(1_000_000 + i), f"sweep-{i}", False, status, stage, message, "recipes/r.yaml",
               submitted, submitted + dt.timedelta(minutes=3), submitted + dt.timedelta(minutes=30),
               submitted + dt.timedelta(minutes=30), 0 if status == "completed" else None, METADATA, received)
        event_rows = []
        for k, (s, st, msg) in enumerate(events):
            event_id += 1
            event_rows.append((event_id, i + 1, s, st, msg, submitted + dt.timedelta(minutes=k)))
        yield job, event_rows


JOB_COLUMNS = ("id, cluster, job_id, job_name, is_placeholder, status, stage, message, recipe, submitted_at,"
               " started_at, completed_at, updated_at, exit_code, metadata, received_at")
EVENT_COLUMNS = "id, job_pk, status, stage, message, created_at"
RECOUNT = "INSERT INTO job_counts (cluster, status, jobs) SELECT cluster, status, count(*) FROM jobs GROUP BY 1, 2"


def seed_postgres(url: str, n: int) -> int:
    """Replace every job with n seeded ones; returns the highest event id."""
    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn) as conn:
        conn.execute("TRUNCATE job_events, jobs, job_counts, job_count_stripes RESTART IDENTITY CASCADE")
        last = 0
        with conn.cursor() as cur:
            with cur.copy(f"COPY jobs ({JOB_COLUMNS}) FROM STDIN") as jobs_copy:
                events = []
                for job, event_rows in rows(n):
                    jobs_copy.write_row(job)
                    events.extend(event_rows)
            with cur.copy(f"COPY job_events ({EVENT_COLUMNS}) FROM STDIN") as events_copy:
                for event in events:
                    events_copy.write_row(event)
                    last = event[0]
        conn.execute(RECOUNT)
        conn.execute("SELECT setval('jobs_id_seq', %s)", (n,))
    # Seeded ids are explicit: new ones must start above them (store/event_ids.py).
    engine = create_engine(url)
    try:
        settle_event_ids(engine)
    finally:
        engine.dispose()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE jobs")
        conn.execute("VACUUM ANALYZE job_events")
    return last


def _sqlite_time(value: dt.datetime) -> str:
    # The text form SQLAlchemy's SQLite DateTime writes, so seeded rows sort with live ones.
    return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def seed_sqlite(url: str, n: int) -> int:
    """The same seed for a SQLite file."""
    path = make_url(url).database
    assert path is not None, url
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("DELETE FROM job_events")
        conn.execute("DELETE FROM jobs")
        conn.execute("DELETE FROM job_counts")
        last = 0
        jobs, events = [], []
        for job, event_rows in rows(n):
            jobs.append(tuple(_sqlite_time(v) if isinstance(v, dt.datetime) else v
                              for v in job))
            for e in event_rows:
                events.append((*e[:5], _sqlite_time(e[5])))
                last = e[0]
        conn.executemany(f"INSERT INTO jobs ({JOB_COLUMNS}) VALUES ({', '.join('?' * 16)})", jobs)
        conn.executemany(f"INSERT INTO job_events ({EVENT_COLUMNS}) VALUES ({', '.join('?' * 6)})", events)
        conn.execute(RECOUNT)
    conn.execute("ANALYZE")
    conn.close()
    return last


def seed_builtin(path: str, n: int) -> int:
    """The same seed in the built-in stand-in's own schema (bench/builtin_app.py): jobs keyed by job_id."""
    builtin_app.create_schema(path)
    # Seeded times repeat across jobs (event k of job i is at minute i + k): format each once.
    stamp = functools.cache(format_timestamp)
    jobs, events = [], []
    last = 0
    for job, event_rows in rows(n):
        (_pk, cluster, job_id, job_name, _placeholder, status, stage, message, recipe, submitted, started, completed,
         updated, exit_code, metadata, _received) = job
        jobs.append((job_id, job_name, cluster, recipe, status, stage, message, stamp(submitted), stamp(started),
                     stamp(completed), stamp(updated), exit_code, None, None, None, metadata))
        for event_id, _job_pk, s, st, msg, at in event_rows:
            events.append((event_id, job_id, s, st, msg, stamp(at)))
            last = event_id
    with contextlib.closing(builtin_app.connect(path, timeout=30.0)) as conn:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("DELETE FROM job_events")
        conn.execute("DELETE FROM jobs")
        conn.executemany(f"INSERT INTO jobs ({builtin_app.JOB_COLUMNS}) VALUES ({', '.join('?' * 16)})", jobs)
        conn.executemany("INSERT INTO job_events (id, job_id, status, stage, message, created_at)"
                         " VALUES (?, ?, ?, ?, ?, ?)", events)
        conn.execute("COMMIT")
        conn.execute("ANALYZE")
        # Fold the seed's WAL into the file now, not in the middle of a measurement.
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return last
