"""The floor of this stack: Flask + raw psycopg doing each write in one statement, one round trip.

Served by gunicorn with the collector's own deploy/gunicorn.conf.py, against the same
schema (``BASELINE_DSN``, as the baseline). Unlike the baseline it pays for none of the
product's guarantees: no advisory locks (racing first writes of a job are left to the
unique index, the feed may commit out of order), no ``job_counts`` moves, no validation,
no auth, no check of the job's last event. A write is one autocommitted statement:

- ``PUT /api/jobs/<id>``: upsert of the job row on ``(cluster, job_id)`` and the event
  insert, in one CTE;
- ``POST /api/jobs``: insert of the job row (nothing on a conflict) and its
  ``submitted`` event, in one CTE;
- ``POST /api/jobs/<id>/logs``: the job row (a placeholder if new), the file row with
  its size, and the chunk, in one CTE.

Reads are the baseline's own view functions (the same queries; reads take no locks).
The gap between this floor and the baseline is what the locks and counts cost; the
gap between the baseline and the collector is what our code costs.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json

from flask import Flask
from flask import request

from bench.baseline_app import detail
from bench.baseline_app import feed
from bench.baseline_app import hello
from bench.baseline_app import list_jobs
from bench.baseline_app import reply
from bench.baseline_app import thread_connection

app = Flask(__name__)
app.add_url_rule("/hello", view_func=hello)
app.add_url_rule("/api/jobs", view_func=list_jobs, methods=["GET"])
app.add_url_rule("/api/jobs/<job_id>", view_func=detail, methods=["GET"])
app.add_url_rule("/api/events", view_func=feed, methods=["GET"])

# The connection is in autocommit mode: one statement is one implicit transaction, so a
# write is a single round trip (no BEGIN, no COMMIT).
CREATE = (
    "WITH job AS (INSERT INTO jobs (cluster, job_id, job_name, is_placeholder, status, recipe, submitted_at,"
    " updated_at, metadata, received_at)"
    " VALUES (%(cluster)s, %(job_id)s, %(job_name)s, false, 'submitted', %(recipe)s, %(submitted_at)s,"
    " %(submitted_at)s, %(metadata)s, now())"
    " ON CONFLICT (cluster, job_id) DO NOTHING RETURNING id, submitted_at)"
    " INSERT INTO job_events (job_pk, status, created_at) SELECT id, 'submitted', submitted_at FROM job"
)
UPDATE = (
    "WITH job AS (INSERT INTO jobs (cluster, job_id, job_name, is_placeholder, status, stage, message, submitted_at,"
    " started_at, completed_at, updated_at, exit_code, logs_url, metadata, received_at)"
    " VALUES (%(cluster)s, %(job_id)s, %(job_name)s, true, %(status)s, %(stage)s, %(message)s, %(updated_at)s,"
    " %(started_at)s, %(completed_at)s, %(updated_at)s, %(exit_code)s, %(logs_url)s, %(metadata)s, now())"
    " ON CONFLICT (cluster, job_id) DO UPDATE SET status = excluded.status, stage = excluded.stage,"
    " message = excluded.message, started_at = coalesce(excluded.started_at, jobs.started_at),"
    " completed_at = coalesce(excluded.completed_at, jobs.completed_at),"
    " exit_code = coalesce(excluded.exit_code, jobs.exit_code), logs_url = coalesce(excluded.logs_url, jobs.logs_url),"
    " updated_at = excluded.updated_at, received_at = excluded.received_at,"
    " metadata = coalesce(jobs.metadata, '{}'::jsonb) || coalesce(excluded.metadata, '{}'::jsonb)"
    " RETURNING id)"
    " INSERT INTO job_events (job_pk, status, stage, message, created_at)"
    " SELECT id, %(status)s, %(stage)s, %(message)s, %(updated_at)s FROM job"
)
# The size moves in the file row's own upsert: a second UPDATE of that row in the same
# statement would not see the row the upsert just wrote.
LOG_CHUNK = (
    "WITH found AS (SELECT id FROM jobs WHERE cluster = %(cluster)s AND job_id = %(job_id)s),"
    " made AS (INSERT INTO jobs (cluster, job_id, job_name, is_placeholder, status, submitted_at, updated_at,"
    " received_at) SELECT %(cluster)s, %(job_id)s, %(job_name)s, true, 'submitted', %(now)s, %(now)s, %(now)s"
    " WHERE NOT EXISTS (SELECT 1 FROM found) ON CONFLICT (cluster, job_id) DO NOTHING RETURNING id),"
    " job AS (SELECT id FROM found UNION ALL SELECT id FROM made),"
    " file AS (INSERT INTO blob_files (job_pk, kind, name, name_key, size, final_size, done, updated_at)"
    " SELECT id, 'log', %(file)s, %(key)s, CASE WHEN %(offset)s = 0 THEN %(end)s ELSE 0 END,"
    " CASE WHEN %(final)s THEN %(end)s END, %(final)s, %(now)s FROM job"
    " ON CONFLICT (job_pk, kind, name_key) DO UPDATE SET updated_at = excluded.updated_at,"
    " size = CASE WHEN %(offset)s <= blob_files.size THEN greatest(blob_files.size, %(end)s)"
    " ELSE blob_files.size END,"
    " final_size = CASE WHEN %(final)s THEN %(end)s ELSE blob_files.final_size END,"
    " done = blob_files.done OR %(final)s RETURNING id)"
    " INSERT INTO blob_chunks (file_id, start_offset, end_offset, data)"
    " SELECT id, %(offset)s, %(end)s, %(data)s FROM file WHERE %(end)s > %(offset)s"
)


@app.post("/api/jobs")
def create():
    body = request.get_json(force=True)
    thread_connection().execute(CREATE, {
        "cluster": body.get("cluster") or "", "job_id": body["job_id"], "job_name": body["job_name"],
        "recipe": body.get("recipe"), "submitted_at": body["submitted_at"],
        "metadata": json.dumps(body.get("metadata")),
    })
    return reply({"job_id": body["job_id"], "status": "submitted"}, 201)


@app.put("/api/jobs/<job_id>")
def update(job_id: str):
    body = request.get_json(force=True)
    metadata = body.get("metadata") or {}
    thread_connection().execute(UPDATE, {
        "cluster": metadata.get("cluster") or "", "job_id": job_id, "job_name": f"job-{job_id}",
        "status": body["status"], "stage": body.get("stage"), "message": body.get("message"),
        "started_at": body.get("started_at"), "completed_at": body.get("completed_at"),
        "updated_at": body["updated_at"], "exit_code": body.get("exit_code"), "logs_url": body.get("logs_url"),
        "metadata": json.dumps(metadata),
    })
    return reply({"job_id": job_id, "status": body["status"]})


@app.post("/api/jobs/<job_id>/logs")
def upload_log(job_id: str):
    """A raw log chunk at ?file=&offset=: job, file row and chunk in one statement, no lock, no checks."""
    args = request.args
    name, offset = args["file"], int(args["offset"])
    data = request.get_data(cache=False)
    thread_connection().execute(LOG_CHUNK, {
        "cluster": args.get("cluster") or "", "job_id": job_id, "job_name": f"job-{job_id}",
        "now": dt.datetime.now(dt.UTC), "file": name, "key": hashlib.sha256(name.encode()).hexdigest(),
        "offset": offset, "end": offset + len(data), "final": args.get("final") == "1", "data": data,
    })
    return reply({"job_id": job_id, "stored": 1 if data else 0})
