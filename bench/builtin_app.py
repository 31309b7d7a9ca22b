"""A stand-in for srtctl's built-in collector (``srtctl status-server``), for the bench.

This is a stand-in written from the built-in collector's documented design (stdlib
http.server + sqlite3, connection per operation, BEGIN IMMEDIATE), not its code: a
``ThreadingHTTPServer`` (a thread per connection, HTTP/1.1 keep-alive) in one process,
and for every operation a new ``sqlite3`` connection to one WAL file, closed after it.
Writes are ``BEGIN IMMEDIATE`` transactions; reads run their statements in autocommit.
Bodies are validated with the contract's pydantic models (the built-in validates with
``srtctl.contract``; our NUL check, which that lacks, is skipped) and answers are built
with them; the bearer token is compared with ``hmac.compare_digest`` before anything
else. Jobs are keyed by ``job_id`` alone, as the built-in keys them (``?cluster=`` on
reads is ignored).

Per request:

- ``POST /api/jobs``: read the row; insert the job and its ``submitted`` event, or
  complete its identity (placeholder name, null cluster or recipe, earlier
  ``submitted_at``, metadata merged) without touching its status.
- ``PUT /api/jobs/<id>``: read the row; insert a placeholder or update it (artifacts and
  metadata merged as JSON); read the job's last event; insert an event when
  ``(status, stage, message)`` changed.
- ``GET /api/jobs``: ``COUNT(*)`` and a page ordered by ``submitted_at DESC``;
  ``GET /api/jobs/<id>``: the row and its events; ``GET /api/events``: events by id.

Two choices differ from the library defaults so the stand-in is measured on its design
rather than on socketserver's: a listen backlog of 128 (not 5, which drops SYNs under 16
fresh connections) and TCP_NODELAY (headers and body are two writes). SQLite runs with
its default ``synchronous`` (FULL), since the design names only WAL.

    python -m bench.builtin_app --db PATH [--host 127.0.0.1] [--port 0]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hmac
import json
import logging
import os
import sqlite3
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from http.server import ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs
from urllib.parse import unquote
from urllib.parse import urlsplit

from pydantic import BaseModel
from pydantic import ValidationError

from collector.contract import TEXT_CHECKED
from collector.contract import EventFeedResponse
from collector.contract import JobCreatePayload
from collector.contract import JobDetail
from collector.contract import JobListResponse
from collector.contract import JobResponse
from collector.contract import JobUpdatePayload
from collector.contract import format_timestamp

log = logging.getLogger("builtin")

MAX_BODY = 1024 * 1024
# srtctl.contract has no check for NUL characters or lone surrogates: skip our contract's walk for them.
CONTRACT_ONLY = {TEXT_CHECKED: True}
SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY,
    job_name TEXT NOT NULL,
    cluster TEXT,
    recipe TEXT,
    status TEXT NOT NULL,
    stage TEXT,
    message TEXT,
    submitted_at TEXT NOT NULL,
    started_at TEXT,
    completed_at TEXT,
    updated_at TEXT NOT NULL,
    exit_code INTEGER,
    logs_url TEXT,
    benchmark_results TEXT,
    artifacts TEXT,
    metadata TEXT
);
CREATE TABLE IF NOT EXISTS job_events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL,
    status TEXT NOT NULL,
    stage TEXT,
    message TEXT,
    created_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS ix_jobs_status ON jobs (status);
CREATE INDEX IF NOT EXISTS ix_jobs_cluster ON jobs (cluster);
CREATE INDEX IF NOT EXISTS ix_jobs_submitted_at ON jobs (submitted_at DESC);
CREATE INDEX IF NOT EXISTS ix_job_events_job_id_id ON job_events (job_id, id);
"""
JOB_COLUMNS = ("job_id, job_name, cluster, recipe, status, stage, message, submitted_at, started_at, completed_at,"
               " updated_at, exit_code, logs_url, benchmark_results, artifacts, metadata")
SUMMARY_COLUMNS = ("job_id, job_name, status, stage, message, cluster, submitted_at, started_at, completed_at,"
                   " updated_at, exit_code")
JSON_COLUMNS = ("benchmark_results", "artifacts", "metadata")


def now() -> str:
    return format_timestamp(dt.datetime.now(dt.UTC))


def connect(path: str, timeout: float = 5.0) -> sqlite3.Connection:
    """A new connection in autocommit mode (transactions are explicit), rows by column name."""
    conn = sqlite3.connect(path, timeout=timeout, isolation_level=None)
    conn.row_factory = sqlite3.Row
    return conn


def create_schema(path: str) -> None:
    """Create the tables and indexes if missing, and put the file in WAL mode (it stays so)."""
    with contextlib.closing(connect(path)) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.executescript(SCHEMA)


def empty(path: str) -> None:
    """Delete every job and event (the bench, between rounds)."""
    with contextlib.closing(connect(path, timeout=30.0)) as conn:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("DELETE FROM job_events")
        conn.execute("DELETE FROM jobs")
        conn.execute("COMMIT")


class Store:
    """The SQLite side: a new connection for every operation."""

    def __init__(self, path: str) -> None:
        self.path = path

    @contextlib.contextmanager
    def reading(self) -> Iterator[sqlite3.Connection]:
        with contextlib.closing(connect(self.path)) as conn:
            yield conn

    @contextlib.contextmanager
    def writing(self) -> Iterator[sqlite3.Connection]:
        """A write transaction: BEGIN IMMEDIATE takes the file's write lock up front."""
        with contextlib.closing(connect(self.path)) as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def create(self, body: JobCreatePayload) -> str:
        """Insert the job and its submitted event, or complete its identity; returns its status."""
        submitted = format_timestamp(body.submitted_at)
        with self.writing() as conn:
            row = conn.execute("SELECT * FROM jobs WHERE job_id = ?", (body.job_id,)).fetchone()
            if row is None:
                conn.execute(
                    "INSERT INTO jobs (job_id, job_name, cluster, recipe, status, submitted_at, updated_at, metadata)"
                    " VALUES (?, ?, ?, ?, 'submitted', ?, ?, ?)",
                    (body.job_id, body.job_name, body.cluster, body.recipe, submitted, submitted,
                     _dump(body.metadata)))
                conn.execute("INSERT INTO job_events (job_id, status, created_at) VALUES (?, 'submitted', ?)",
                             (body.job_id, submitted))
                log.info("job %s submitted (%s)", body.job_id, body.job_name)
                return "submitted"
            # A late or repeated POST never rewinds status and never overwrites identity.
            metadata = {**(body.metadata or {}), **(_load(row["metadata"]) or {})}
            conn.execute(
                "UPDATE jobs SET job_name = ?, cluster = coalesce(cluster, ?), recipe = coalesce(recipe, ?),"
                " submitted_at = min(submitted_at, ?), metadata = ? WHERE job_id = ?",
                (body.job_name if row["job_name"] == f"job-{body.job_id}" else row["job_name"], body.cluster,
                 body.recipe, submitted, _dump(metadata), body.job_id))
            return str(row["status"])

    def update(self, job_id: str, body: JobUpdatePayload) -> None:
        """Insert or update the job; append an event when (status, stage, message) changed."""
        status = body.status.value
        stage = body.stage.value if body.stage else None
        updated = format_timestamp(body.updated_at)
        given: dict[str, Any] = {
            "started_at": format_timestamp(body.started_at) if body.started_at else None,
            "completed_at": format_timestamp(body.completed_at) if body.completed_at else None,
            "exit_code": body.exit_code, "logs_url": body.logs_url,
            "benchmark_results": _dump(body.benchmark_results),
        }
        reported = body.metadata or {}
        with self.writing() as conn:
            row = conn.execute("SELECT * FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
            if row is None:
                # A PUT whose POST never arrived: a placeholder named from the started report if it can be.
                conn.execute(
                    "INSERT INTO jobs (job_id, job_name, cluster, status, stage, message, submitted_at, started_at,"
                    " completed_at, updated_at, exit_code, logs_url, benchmark_results, artifacts, metadata)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (job_id, reported.get("job_name") or f"job-{job_id}", reported.get("cluster"), status, stage,
                     body.message, updated, given["started_at"], given["completed_at"], updated, body.exit_code,
                     body.logs_url, given["benchmark_results"], _dump(body.artifacts), _dump(body.metadata)))
                old_status = None
            else:
                sets = {name: value for name, value in given.items() if value is not None}
                sets.update(status=status, stage=stage, message=body.message, updated_at=updated)
                if body.artifacts is not None:
                    sets["artifacts"] = _dump({**(_load(row["artifacts"]) or {}), **body.artifacts})
                if body.metadata is not None:
                    sets["metadata"] = _dump({**(_load(row["metadata"]) or {}), **body.metadata})
                if row["job_name"] == f"job-{job_id}" and reported.get("job_name"):
                    sets["job_name"] = reported["job_name"]
                if row["cluster"] is None and reported.get("cluster"):
                    sets["cluster"] = reported["cluster"]
                assignments = ", ".join(f"{name} = ?" for name in sets)
                conn.execute(f"UPDATE jobs SET {assignments} WHERE job_id = ?", (*sets.values(), job_id))
                old_status = row["status"]
            last = conn.execute("SELECT status, stage, message FROM job_events WHERE job_id = ?"
                                " ORDER BY id DESC LIMIT 1", (job_id,)).fetchone()
            if last is None or tuple(last) != (status, stage, body.message):
                conn.execute("INSERT INTO job_events (job_id, status, stage, message, created_at)"
                             " VALUES (?, ?, ?, ?, ?)", (job_id, status, stage, body.message, now()))
        if old_status != status:
            log.info("job %s: %s -> %s (%s)", job_id, old_status, status, body.message or "")

    def list_jobs(self, status: str | None, cluster: str | None, page: int, per_page: int) -> JobListResponse:
        where: list[str] = []
        params: list[str] = []
        if status:
            where.append("status = ?")
            params.append(status)
        if cluster:
            where.append("cluster = ?")
            params.append(cluster)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        with self.reading() as conn:
            total = conn.execute(f"SELECT COUNT(*) FROM jobs{clause}", params).fetchone()[0]
            rows = conn.execute(f"SELECT {SUMMARY_COLUMNS} FROM jobs{clause} ORDER BY submitted_at DESC"
                                " LIMIT ? OFFSET ?", (*params, per_page, (page - 1) * per_page)).fetchall()
        return JobListResponse.model_validate({"jobs": [dict(row) for row in rows], "total": total, "page": page,
                                               "per_page": per_page})

    def detail(self, job_id: str) -> JobDetail | None:
        with self.reading() as conn:
            row = conn.execute(f"SELECT {JOB_COLUMNS} FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
            if row is None:
                return None
            events = conn.execute("SELECT id, job_id, status, stage, message, created_at FROM job_events"
                                  " WHERE job_id = ? ORDER BY id", (job_id,)).fetchall()
        job = dict(row)
        for name in JSON_COLUMNS:
            job[name] = _load(job[name])
        job["events"] = [dict(event) for event in events]
        return JobDetail.model_validate(job)

    def events(self, after: int, limit: int, job_id: str | None) -> EventFeedResponse:
        where = "id > ?"
        params: list[Any] = [after]
        if job_id:
            where += " AND job_id = ?"
            params.append(job_id)
        with self.reading() as conn:
            rows = conn.execute(f"SELECT id, job_id, status, stage, message, created_at FROM job_events"
                                f" WHERE {where} ORDER BY id LIMIT ?", (*params, limit)).fetchall()
        events = [dict(row) for row in rows]
        return EventFeedResponse.model_validate(
            {"events": events, "next_cursor": events[-1]["id"] if events else (after or None)})


def _dump(value: dict[str, Any] | None) -> str | None:
    return None if value is None else json.dumps(value)


def _load(value: str | None) -> Any:
    return None if value is None else json.loads(value)


class BadRequest(Exception):
    """A query parameter that is not what the route takes (422)."""


def _int(query: dict[str, list[str]], name: str, default: int, low: int, high: int) -> int:
    values = query.get(name)
    if not values:
        return default
    try:
        value = int(values[0])
    except ValueError:
        raise BadRequest(f"{name} must be an integer") from None
    return max(low, min(value, high))


class Server(ThreadingHTTPServer):
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], store: Store, write_token: str | None,
                 read_token: str | None) -> None:
        super().__init__(address, Handler)
        self.store = store
        self.write_token = write_token.encode() if write_token else None
        self.read_token = read_token.encode() if read_token else None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: Server

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass  # no access line per request, only one per lifecycle transition

    def log_message(self, format: str, *args: Any) -> None:
        log.warning(format, *args)

    def _handle(self, method: str) -> None:
        url = urlsplit(self.path)
        path = url.path
        if path == "/api/health" and method == "GET":
            return self._send(200, {"status": "ok"})
        # Auth before routing and before any body is read.
        denied = self._denied(write=method != "GET")
        if denied:
            return self._send(*denied)
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            return self._send(413, {"detail": "body too large"})
        body = self.rfile.read(length) if length else b""
        store = self.server.store
        query = parse_qs(url.query)
        try:
            if path == "/api/jobs" and method == "POST":
                create = JobCreatePayload.model_validate_json(body, context=CONTRACT_ONLY)
                return self._send(201, JobResponse(job_id=create.job_id, status=store.create(create)))
            if path == "/api/jobs" and method == "GET":
                page = _int(query, "page", 1, 1, 1_000_000)
                per_page = _int(query, "per_page", 50, 1, 100)
                return self._send(200, store.list_jobs(_first(query, "status"), _first(query, "cluster"), page,
                                                       per_page))
            if path == "/api/events" and method == "GET":
                after = _int(query, "after", 0, 0, 2**63 - 1)
                limit = _int(query, "limit", 100, 1, 1000)
                return self._send(200, store.events(after, limit, _first(query, "job_id")))
            if path.startswith("/api/jobs/") and "/" not in path[len("/api/jobs/"):]:
                job_id = unquote(path[len("/api/jobs/"):])
                if method == "PUT":
                    update = JobUpdatePayload.model_validate_json(body, context=CONTRACT_ONLY)
                    store.update(job_id, update)
                    return self._send(200, JobResponse(job_id=job_id, status=update.status.value))
                if method == "GET":
                    job = store.detail(job_id)
                    return self._send(200, job) if job else self._send(404, {"detail": "job not found"})
        except ValidationError as exc:
            return self._send(422, {"detail": "invalid body", "errors": exc.errors(include_url=False)})
        except BadRequest as exc:
            return self._send(422, {"detail": str(exc)})
        return self._send(404, {"detail": "not found"})

    def _denied(self, *, write: bool) -> tuple[int, dict[str, str], dict[str, str]] | None:
        """None when the request may go on, else the status, body and headers of the refusal."""
        server = self.server
        if server.write_token is None:
            return None  # an open server (loopback only)
        scheme, _, token = self.headers.get("Authorization", "").partition(" ")
        given = token.strip().encode()
        if scheme.lower() == "bearer" and hmac.compare_digest(given, server.write_token):
            return None
        if scheme.lower() == "bearer" and server.read_token and hmac.compare_digest(given, server.read_token):
            return None if not write else (403, {"detail": "read token on a write route"}, {})
        return 401, {"detail": "missing or wrong token"}, {"WWW-Authenticate": "Bearer"}

    def _send(self, status: int, body: BaseModel | dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = body.model_dump_json().encode() if isinstance(body, BaseModel) else json.dumps(body,
                                                                                              default=str).encode()
        if status >= 400 and self.command in ("POST", "PUT"):
            # A refused body may not have been read: the connection cannot carry another request.
            self.close_connection = True
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)


def _first(query: dict[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[0] if values else None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", required=True, help="the SQLite file (created if missing)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    write_token = os.environ.get("SRTCTL_STATUS_TOKEN") or None
    read_token = os.environ.get("SRTCTL_STATUS_READ_TOKEN") or None
    create_schema(args.db)
    server = Server((args.host, args.port), Store(args.db), write_token, read_token)
    # The line bench/run.py (tests.processes.ServerProcess) waits for.
    print(f"listening on http://{args.host}:{server.server_port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
