"""PostgreSQL's CPU per write transaction, for the PUT's statements and variants of them.

    python -m bench.write_cpu                        # every variant, 5,000 transactions, 3 runs
    python -m bench.write_cpu --only as_is,no_count --transactions 8000

One connection sends the write path's own statements as it sends them (store/pg_driver.py:
one simple-protocol query per round trip, prepared statements run by name) against 2,000
jobs in a database created for the run; the backend's CPU comes from ``/proc``. No HTTP, no
concurrency: what a variant costs the server, apart from everything else. Each run starts
from the same tables, and the variants alternate, so drift hits them all.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import random
import time
from collections.abc import Callable

import psycopg
from psycopg import generators
from psycopg import pq
from psycopg.adapt import Transformer

from bench.run import Databases
from bench.run import _dsn
from collector.store import counts
from collector.store import pg_driver
from collector.store.identity import JOB_LOCK

JOBS = 2000
STATUSES = ("starting", "workers")
_SAVE = pg_driver.SAVE_EXISTING[True, True]
# The same write with the event id drawn in the statement instead of by the column default.
_EXPLICIT_ID = pg_driver.statement("bench_save_explicit_id", _SAVE.text.replace(
    "INSERT INTO job_events (job_pk,", "INSERT INTO job_events (id, job_pk,").replace(
    "VALUES (%(pk)s,", "VALUES ((SELECT pg_current_xact_id()::text::bigint + shift FROM event_id_shift), %(pk)s,"))

Send = Callable[[list[bytes]], None]
Run = Callable[[pg_driver.Statement, dict], list[bytes]]


def _as_is(send: Send, run: Run, params: dict) -> None:
    send([b"BEGIN", *run(pg_driver.LOCKED_ROWS_OF_JOB_ID, params)])
    send([*run(_SAVE, params), b"COMMIT"])


def _no_count(send: Send, run: Run, params: dict) -> None:
    send([b"BEGIN", *run(pg_driver.LOCKED_ROWS_OF_JOB_ID, params)])
    send([*run(pg_driver.SAVE_EXISTING[True, False], params), b"COMMIT"])


def _explicit_id(send: Send, run: Run, params: dict) -> None:
    send([b"BEGIN", *run(pg_driver.LOCKED_ROWS_OF_JOB_ID, params)])
    send([*run(_EXPLICIT_ID, params), b"COMMIT"])


def _lock_only(send: Send, run: Run, params: dict) -> None:
    send([b"BEGIN", *run(pg_driver.LOCKED_ROWS_OF_JOB_ID, params), b"COMMIT"])


def _empty(send: Send, run: Run, params: dict) -> None:
    send([b"BEGIN", b"SELECT 1", b"COMMIT"])


VARIANTS = {"as_is": _as_is, "no_count": _no_count, "explicit_id": _explicit_id, "lock_only": _lock_only,
            "empty": _empty}


def _cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def measure(dsn: str, variant: Callable[[Send, Run, dict], None], transactions: int) -> tuple[float, float]:
    """Wall time and backend CPU per transaction (µs) of ``variant``, from freshly seeded tables."""
    with psycopg.connect(dsn) as conn:
        conn.execute("TRUNCATE jobs, job_events, job_count_stripes CASCADE")
        now = dt.datetime.now(dt.UTC)
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO jobs (cluster, job_id, job_name, status, submitted_at, updated_at,"
                            " received_at, metadata) VALUES ('c', %s, 'n', 'starting', %s, %s, %s, %s::jsonb)",
                            [(f"j{i}", now, now, now, '{"cluster": "c"}') for i in range(JOBS)])
        conn.commit()
        pks: dict[str, int] = dict(conn.execute("SELECT job_id, id FROM jobs").fetchall())
        tx, prepared, pgconn = Transformer.from_context(conn), set(), conn.pgconn

        def send(parts: list[bytes]) -> None:
            pgconn.send_query(b"; ".join(parts))
            for result in conn.wait(generators.execute(pgconn)):
                if result.status == pq.ExecStatus.FATAL_ERROR:
                    raise psycopg.errors.error_from_result(result, encoding="utf-8")

        def run(statement: pg_driver.Statement, params: dict) -> list[bytes]:
            parts = [] if statement.name in prepared else [statement.prepare]
            prepared.add(statement.name)
            values = b", ".join(pg_driver.literal(tx, params[name]) for name in statement.parameters)
            return [*parts, statement.execute + (b"(" + values + b")" if statement.parameters else b"")]

        pid, started, ticks = conn.info.backend_pid, time.perf_counter(), _cpu_ticks(conn.info.backend_pid)
        for n in range(transactions):
            job_id, status, at = f"j{random.randrange(JOBS)}", STATUSES[n % 2], dt.datetime.now(dt.UTC)
            row = {name: None for name in pg_driver.COLUMNS} | {
                "cluster": "c", "job_id": job_id, "job_name": "n", "is_placeholder": False, "status": status,
                "message": f"step {n}", "submitted_at": at, "started_at": at, "updated_at": at, "received_at": at,
                "metadata": {"cluster": "c"}}
            variant(send, run, {
                **pg_driver.row_params(row), "created_at": at, "credential": None, "pk": pks[job_id], "changed": True,
                "old_cluster": "c", "old_status": STATUSES[(n + 1) % 2], "old_delta": -1, "new_cluster": "c",
                "new_status": status, "new_delta": 1, "stripe": random.randrange(counts.STRIPES),
                "namespace": JOB_LOCK, "job_id": job_id})
        wall = (time.perf_counter() - started) / transactions * 1e6
        cpu = (_cpu_ticks(pid) - ticks) / os.sysconf("SC_CLK_TCK") / transactions * 1e6
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pg-url", default=os.environ.get("COLLECTOR_BENCH_DATABASE_URL", "postgresql:///postgres"),
                        help="server on which to create (and drop) the run's database")
    parser.add_argument("--only", default=",".join(VARIANTS), help="comma-separated variants: " + ", ".join(VARIANTS))
    parser.add_argument("--transactions", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    databases = Databases(args.pg_url)
    try:
        dsn = _dsn(databases.create())
        print("| variant | run | wall µs per transaction | backend CPU µs per transaction |\n|---|---:|---:|---:|")
        for run in range(1, args.runs + 1):
            for name in args.only.split(","):
                wall, cpu = measure(dsn, VARIANTS[name], args.transactions)
                print(f"| {name} | {run} | {wall:.0f} | {cpu:.0f} |", flush=True)
    finally:
        databases.drop_all()


if __name__ == "__main__":
    main()
