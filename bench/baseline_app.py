"""The practical upper bound of this stack: Flask + raw psycopg, no validation, ORM or auth.

Served by gunicorn with the collector's own deploy/gunicorn.conf.py, against the same
schema, doing the same database work per request as the collector: the same rows
written and read, and the same two advisory locks (one per job id so racing first
writes make one row, one around event inserts so the feed never skips), because those
are what the product's guarantees cost in the database, not overhead of our code.

A raw log chunk (``POST /api/jobs/<id>/logs``) is, under the job id's lock: the job row
(a placeholder if new), an upsert of the file row, the chunk row and the size update,
with no checks of overlaps, resends or names.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
import threading

import psycopg
from flask import Flask
from flask import Response
from flask import request

app = Flask(__name__)
DSN = os.environ["BASELINE_DSN"]
_local = threading.local()


def thread_connection() -> psycopg.Connection:
    """This thread's connection, in autocommit mode (bench/floor_app.py writes on it directly)."""
    conn = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        # One long-lived connection per gunicorn thread: the cheapest pooling there is.
        conn = _local.conn = psycopg.connect(DSN, autocommit=True)
    return conn


@contextlib.contextmanager
def connection():
    """A transaction on this thread's connection (commit on success, rollback on error)."""
    conn = thread_connection()
    with conn.transaction():
        yield conn


def reply(body: dict, status: int = 200) -> Response:
    return Response(json.dumps(body, default=str), status=status, mimetype="application/json")


LOCK_JOB = "SELECT pg_advisory_xact_lock(1, hashtext(%s))"
# The event insert and the per-(cluster, status) count move the collector keeps for the
# list's totals, in one statement under the feed lock, as the collector does them.
INSERT_EVENT = (
    "WITH feed_lock AS MATERIALIZED (SELECT pg_advisory_xact_lock(2, 0)),"
    " event AS (INSERT INTO job_events (job_pk, status, stage, message, created_at)"
    " SELECT %(pk)s, %(status)s, %(stage)s, %(message)s, %(at)s FROM feed_lock),"
    " counted AS (INSERT INTO job_counts (cluster, status, jobs) SELECT v.cluster, v.status, v.delta"
    " FROM feed_lock, (VALUES (%(cluster)s, %(old_status)s, -1), (%(cluster)s, %(status)s, 1))"
    " AS v (cluster, status, delta) WHERE %(moved)s AND v.status IS NOT NULL ORDER BY v.cluster, v.status"
    " ON CONFLICT (cluster, status) DO UPDATE SET jobs = job_counts.jobs + excluded.jobs)"
    " SELECT 1"
)


def event_params(pk, cluster, status, stage, message, at, old_status) -> dict:
    return {"pk": pk, "cluster": cluster, "status": status, "stage": stage, "message": message, "at": at,
            "old_status": old_status, "moved": old_status != status}


@app.get("/hello")
def hello():
    return "hello"


@app.post("/api/jobs")
def create():
    body = request.get_json(force=True)
    with connection() as conn:
        conn.execute(LOCK_JOB, (body["job_id"],))
        row = conn.execute(
            "INSERT INTO jobs (cluster, job_id, job_name, is_placeholder, status, recipe, submitted_at, updated_at,"
            " metadata, received_at) VALUES (%s, %s, %s, false, 'submitted', %s, %s, %s, %s, now())"
            " ON CONFLICT (cluster, job_id) DO UPDATE SET recipe = coalesce(jobs.recipe, excluded.recipe),"
            " received_at = excluded.received_at"
            " RETURNING id, (xmax = 0)",
            (body.get("cluster") or "", body["job_id"], body["job_name"], body.get("recipe"), body["submitted_at"],
             body["submitted_at"], json.dumps(body.get("metadata"))),
        ).fetchone()
        if row[1]:
            conn.execute(INSERT_EVENT, event_params(row[0], body.get("cluster") or "", "submitted", None, None,
                                                    body["submitted_at"], None))
    return reply({"job_id": body["job_id"], "status": "submitted"}, 201)


@app.put("/api/jobs/<job_id>")
def update(job_id: str):
    body = request.get_json(force=True)
    metadata = body.get("metadata") or {}
    with connection() as conn:
        conn.execute(LOCK_JOB, (job_id,))
        cluster = metadata.get("cluster") or ""
        pk, old_status = conn.execute(
            "WITH old AS (SELECT status FROM jobs WHERE cluster = %s AND job_id = %s)"
            " INSERT INTO jobs (cluster, job_id, job_name, is_placeholder, status, stage, message, submitted_at,"
            " updated_at, metadata, received_at) VALUES (%s, %s, %s, true, %s, %s, %s, %s, %s, %s, now())"
            " ON CONFLICT (cluster, job_id) DO UPDATE SET status = excluded.status, stage = excluded.stage,"
            " message = excluded.message, updated_at = excluded.updated_at, received_at = excluded.received_at,"
            " metadata = coalesce(jobs.metadata, '{}'::jsonb) || coalesce(excluded.metadata, '{}'::jsonb)"
            " RETURNING id, (SELECT status FROM old)",
            (cluster, job_id, cluster, job_id, f"job-{job_id}", body["status"], body.get("stage"),
             body.get("message"), body["updated_at"], body["updated_at"], json.dumps(metadata)),
        ).fetchone()
        last = conn.execute(
            "SELECT status, stage, message FROM job_events WHERE job_pk = %s ORDER BY id DESC LIMIT 1", (pk,)
        ).fetchone()
        if last != (body["status"], body.get("stage"), body.get("message")):
            conn.execute(INSERT_EVENT, event_params(pk, cluster, body["status"], body.get("stage"), body.get("message"),
                                                    body["updated_at"], old_status))
    return reply({"job_id": job_id, "status": body["status"]})


SUMMARY = ("job_id, job_name, status, stage, message, cluster, submitted_at, started_at, completed_at, updated_at,"
           " exit_code")


@app.get("/api/jobs")
def list_jobs():
    args = request.args
    page, per_page = int(args.get("page", 1)), min(int(args.get("per_page", 50)), 100)
    where, params = [], []
    for name in ("status", "cluster"):
        if args.get(name):
            where.append(f"{name} = %s")
            params.append(args[name])
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    with connection() as conn:
        # The same per-(cluster, status) counts the collector keeps, not COUNT(*).
        total = conn.execute(f"SELECT coalesce(sum(jobs), 0) FROM job_counts {clause}", params).fetchone()[0]
        cur = conn.execute(
            f"SELECT {SUMMARY} FROM jobs {clause} ORDER BY submitted_at DESC, id DESC LIMIT %s OFFSET %s",
            [*params, per_page, (page - 1) * per_page],
        )
        names = [c.name for c in cur.description]
        jobs = [dict(zip(names, row, strict=True)) for row in cur]
    return reply({"jobs": jobs, "total": total, "page": page, "per_page": per_page})


@app.get("/api/jobs/<job_id>")
def detail(job_id: str):
    with connection() as conn:
        cur = conn.execute("SELECT * FROM jobs WHERE cluster = %s AND job_id = %s",
                           (request.args.get("cluster", ""), job_id))
        row = cur.fetchone()
        if row is None:
            return reply({"detail": "not found"}, 404)
        job = dict(zip([c.name for c in cur.description], row, strict=True))
        events = conn.execute(
            "SELECT id, status, stage, message, created_at FROM job_events WHERE job_pk = %s ORDER BY id",
            (job["id"],),
        ).fetchall()
    job["events"] = [dict(zip(("id", "status", "stage", "message", "created_at"), e, strict=True)) for e in events]
    return reply(job)


@app.get("/api/events")
def feed():
    after, limit = int(request.args.get("after", 0)), min(int(request.args.get("limit", 100)), 1000)
    with connection() as conn:
        rows = conn.execute(
            "SELECT e.id, j.job_id, j.cluster, e.status, e.stage, e.message, e.created_at FROM job_events e"
            " JOIN jobs j ON j.id = e.job_pk WHERE e.id > %s ORDER BY e.id LIMIT %s",
            (after, limit),
        ).fetchall()
    names = ("id", "job_id", "cluster", "status", "stage", "message", "created_at")
    events = [dict(zip(names, row, strict=True)) for row in rows]
    return reply({"events": events, "next_cursor": events[-1]["id"] if events else (after or None)})


JOB_OF_CLUSTER = "SELECT id FROM jobs WHERE cluster = %s AND job_id = %s"
PLACEHOLDER = (
    "INSERT INTO jobs (cluster, job_id, job_name, is_placeholder, status, submitted_at, updated_at, received_at)"
    " VALUES (%s, %s, %s, true, 'submitted', %s, %s, now()) RETURNING id"
)
LOG_FILE = (
    "INSERT INTO blob_files (job_pk, kind, name, name_key, size, done, updated_at)"
    " VALUES (%s, 'log', %s, %s, 0, false, %s)"
    " ON CONFLICT (job_pk, kind, name_key) DO UPDATE SET updated_at = excluded.updated_at RETURNING id"
)
CHUNK = "INSERT INTO blob_chunks (file_id, start_offset, end_offset, data) VALUES (%s, %s, %s, %s)"
# Contiguous uploads only (what the bench sends): a chunk at or before the end extends it.
GROW = (
    "UPDATE blob_files SET size = CASE WHEN %(offset)s <= size THEN greatest(size, %(end)s) ELSE size END,"
    " final_size = CASE WHEN %(final)s THEN %(end)s ELSE final_size END, done = done OR %(final)s"
    " WHERE id = %(id)s"
)


@app.post("/api/jobs/<job_id>/logs")
def upload_log(job_id: str):
    """A raw log chunk at ?file=&offset=: the job (placeholder if new), file row, chunk and size."""
    args = request.args
    name, offset, final = args["file"], int(args["offset"]), args.get("final") == "1"
    cluster = args.get("cluster") or ""
    data = request.get_data(cache=False)
    now = dt.datetime.now(dt.UTC)
    with connection() as conn:
        conn.execute(LOCK_JOB, (job_id,))
        row = conn.execute(JOB_OF_CLUSTER, (cluster, job_id)).fetchone()
        if row is None:
            row = conn.execute(PLACEHOLDER, (cluster, job_id, f"job-{job_id}", now, now)).fetchone()
        (file_id,) = conn.execute(LOG_FILE, (row[0], name, hashlib.sha256(name.encode()).hexdigest(), now)).fetchone()
        if data:
            conn.execute(CHUNK, (file_id, offset, offset + len(data), data))
        conn.execute(GROW, {"offset": offset, "end": offset + len(data), "final": final, "id": file_id})
    return reply({"job_id": job_id, "stored": 1 if data else 0})
