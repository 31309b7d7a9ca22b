"""collector_api views, the Grafana dashboard's SQL and the read-only role, on a seeded PostgreSQL."""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import uuid
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner
from psycopg import sql
from sqlalchemy import create_engine
from sqlalchemy import inspect
from sqlalchemy import make_url
from sqlalchemy import text
from sqlalchemy.pool import NullPool

from collector import migrations
from collector.cli import main

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "dashboards.md"
DASHBOARD = ROOT / "deploy" / "grafana" / "collector.json"
VIEWS = ("jobs", "job_events", "stage_durations", "cluster_activity", "cluster_health", "webhook_deliveries")
NOW = dt.datetime.now(dt.UTC).replace(microsecond=0)
# Every seeded job starts from here; three hours back keeps the 24-hour figures and a
# six-hour dashboard range around all of them.
BASE = NOW - dt.timedelta(hours=3)
RANGE = (BASE - dt.timedelta(hours=1), NOW + dt.timedelta(minutes=5))


def documented_columns() -> dict[str, list[tuple[str, str]]]:
    """Each view's (column, type) rows from the tables in docs/dashboards.md, in order."""
    views: dict[str, list[tuple[str, str]]] = {}
    current = None
    for line in DOCS.read_text().splitlines():
        heading = re.fullmatch(r"### `collector_api\.(\w+)`", line)
        if heading:
            current = views.setdefault(heading[1], [])
        elif line.startswith("#"):
            current = None
        elif current is not None and (row := re.match(r"\| `(\w+)` \| `([^`]+)` \|", line)):
            current.append((row[1], row[2]))
    return views


def panels() -> list[dict]:
    return json.loads(DASHBOARD.read_text())["panels"]


# ---------------------------------------------------------------- seed, through the API

def at(seconds: float) -> str:
    return (BASE + dt.timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


STARTED = {"model": {"path": "/models/deepseek-r1", "precision": "fp8", "container": "img:1"},
           "resources": {"gpu_type": "b200", "gpus_per_node": 8}, "benchmark": {"type": "sa-bench"},
           "backend_type": "sglang", "frontend_type": "dynamo", "head_node": "node-01",
           "log_dir": "/lustre/logs/100"}
# (seconds after BASE, status, stage, message, extra fields): the reporter's typical order.
Report = tuple[int, str, str, str, dict]
COMPLETED_RUN: list[Report] = [
    (60, "starting", "starting", "Job started on node-01", {"started_at": at(60), "metadata": STARTED}),
    (90, "starting", "head_infrastructure", "Starting head infrastructure", {}),
    (150, "workers", "workers", "Starting workers", {}),
    (200, "frontend", "frontend", "Starting frontend", {}),
    (230, "frontend", "frontend", "Inference endpoint ready", {}),
    (300, "benchmark", "benchmark", "Running benchmark", {}),
    (900, "benchmark", "cleanup", "Artifacts uploaded", {"logs_url": "s3://bucket/100/"}),
    (960, "completed", "cleanup", "Benchmark completed successfully",
     {"completed_at": at(960), "exit_code": 0, "logs_url": "s3://bucket/100/"}),
]
FAILED_RUN: list[Report] = [
    (120, "starting", "starting", "Job started on node-07", {"started_at": at(120)}),
    (180, "workers", "workers", "Starting workers", {}),
    (400, "failed", "workers", "worker 3 exited", {"completed_at": at(400), "exit_code": 1}),
]
ACTIVE_WORKERS: list[Report] = [
    (30, "starting", "starting", "Job started on node-02", {"started_at": at(30)}),
    (45, "workers", "workers", "Starting workers", {}),
]
# Same job id as alpha's completed job, on another cluster, with metadata of the wrong types.
ACTIVE_BENCHMARK: list[Report] = [
    (10, "starting", "starting", "Job started on node-09",
     {"started_at": at(10), "metadata": {"resources": {"gpus_per_node": "8"}, "tags": "not-a-list"}}),
    (20, "workers", "workers", "Starting workers", {}),
    (70, "benchmark", "benchmark", "Running benchmark", {}),
]
SEED = {("alpha", "100"): COMPLETED_RUN, ("alpha", "101"): FAILED_RUN,
        ("alpha", "102"): ACTIVE_WORKERS, ("beta", "100"): ACTIVE_BENCHMARK}


@pytest.fixture
def seeded(postgres, api):
    """Four jobs on two clusters, reported as srtctl would, stamped relative to BASE."""
    for (cluster, job_id), reports in SEED.items():
        body = {"job_id": job_id, "job_name": f"sweep-{job_id}", "cluster": cluster, "recipe": "configs/r.yaml",
                "submitted_at": at(0), "metadata": {"tags": ["suite:x", f"job:{job_id}"]}}
        assert api.post("/api/jobs", json=body).status_code == 201
        for offset, status, stage, message, extra in reports:
            metadata = {**extra.get("metadata", {}), "cluster": cluster}
            response = api.put(f"/api/jobs/{job_id}", json={
                "status": status, "stage": stage, "message": message, "updated_at": at(offset),
                **extra, "metadata": metadata})
            assert response.status_code == 200, response.text
    return postgres


def age(offset: float) -> float:
    """Seconds from BASE + ``offset`` to now: what a "so far" column should read."""
    return (dt.datetime.now(dt.UTC) - BASE).total_seconds() - offset


def rows(database, query: str, **params) -> list[tuple]:
    with database.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(query), params)]


# ---------------------------------------------------------------- (a) the documented shape

def test_docs_document_every_view():
    assert list(documented_columns()) == list(VIEWS)
    assert all(documented_columns().values())


def test_view_columns_and_types_are_the_documented_ones(postgres):
    present = rows(postgres, "SELECT table_name, table_type FROM information_schema.tables "
                             "WHERE table_schema = 'collector_api' ORDER BY table_name")
    assert present == sorted((view, "VIEW") for view in VIEWS)
    for view, documented in documented_columns().items():
        actual = [(name, udt[1:] + "[]" if data_type == "ARRAY" else data_type) for name, data_type, udt in rows(
            postgres, "SELECT column_name, data_type, udt_name FROM information_schema.columns "
                      "WHERE table_schema = 'collector_api' AND table_name = :view ORDER BY ordinal_position",
            view=view)]
        assert actual == documented, view


def test_sqlite_gets_no_views(tmp_path):
    url = f"sqlite:///{tmp_path / 'status.db'}"  # on both runs: the revision must be a no-op there
    migrations.upgrade(url)
    engine = create_engine(url, poolclass=NullPool)
    try:
        assert inspect(engine).get_view_names() == []
        assert migrations.current_revision(engine) == migrations.head_revision()
    finally:
        engine.dispose()


# ---------------------------------------------------------------- view contents

def test_jobs_view_flattens_identity_metadata_and_durations(seeded):
    row = rows(seeded, "SELECT cluster, job_id, status, stage, finished, finished_at, queue_seconds, run_seconds, "
                       "exit_code, model, model_precision, container, gpu_type, gpus_per_node, backend_type, "
                       "frontend_type, benchmark_type, head_node, log_dir, tags, logs_url, is_placeholder "
                       "FROM collector_api.jobs WHERE cluster = 'alpha' AND job_id = '100'")
    assert row == [("alpha", "100", "completed", "cleanup", True, BASE + dt.timedelta(seconds=960), 60.0, 900.0,
                    0, "/models/deepseek-r1", "fp8", "img:1", "b200", 8, "sglang", "dynamo", "sa-bench", "node-01",
                    "/lustre/logs/100", ["suite:x", "job:100"], "s3://bucket/100/", False)]
    # A number sent as a string and tags that are not a list read as NULL, and break nothing.
    beta = rows(seeded, "SELECT finished, finished_at, gpus_per_node, tags, run_seconds "
                        "FROM collector_api.jobs WHERE cluster = 'beta' AND job_id = '100'")
    assert beta == [(False, None, None, None, pytest.approx(age(10), abs=30))]


def test_job_events_view_keys_events_by_cluster(seeded):
    counts = rows(seeded, "SELECT cluster, job_id, count(*), min(event_id) > 0 FROM collector_api.job_events "
                          "GROUP BY 1, 2 ORDER BY 1, 2")
    assert counts == [("alpha", "100", 9, True), ("alpha", "101", 4, True), ("alpha", "102", 3, True),
                      ("beta", "100", 4, True)]
    last = rows(seeded, "SELECT status, stage, message, created_at FROM collector_api.job_events "
                        "WHERE cluster = 'alpha' AND job_id = '101' ORDER BY event_id DESC LIMIT 1")
    assert last == [("failed", "workers", "worker 3 exited", BASE + dt.timedelta(seconds=400))]


def test_cluster_activity_counts_each_cluster(seeded):
    activity = rows(seeded, "SELECT cluster, jobs, active_jobs, submitted_jobs, starting_jobs, workers_jobs, "
                            "frontend_jobs, benchmark_jobs, completed_jobs, failed_jobs, timeout_jobs, "
                            "submitted_last_24h, finished_last_24h, failed_last_24h, last_report_at "
                            "FROM collector_api.cluster_activity ORDER BY cluster")
    assert activity == [
        ("alpha", 3, 1, 0, 0, 1, 0, 0, 1, 1, 0, 3, 2, 1, BASE + dt.timedelta(seconds=960)),
        ("beta", 1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, BASE + dt.timedelta(seconds=70)),
    ]
    since = rows(seeded, "SELECT seconds_since_last_report FROM collector_api.cluster_activity "
                         "WHERE cluster = 'beta'")
    assert since == [(pytest.approx(age(70), abs=30),)]


# ---------------------------------------------------------------- (b) stage durations

def spans(database, cluster: str, job_id: str) -> list[tuple]:
    return rows(database, "SELECT stage, status, entered_at, left_at, seconds FROM collector_api.stage_durations "
                          "WHERE cluster = :c AND job_id = :j ORDER BY entered_at", c=cluster, j=job_id)


def closed(*expected: tuple) -> list[tuple]:
    return [(stage, status, BASE + dt.timedelta(seconds=start), BASE + dt.timedelta(seconds=end), float(end - start))
            for stage, status, start, end in expected]


def test_stage_durations_of_a_completed_job(seeded):
    assert spans(seeded, "alpha", "100") == closed(
        (None, "submitted", 0, 60),
        ("starting", "starting", 60, 90),
        ("head_infrastructure", "starting", 90, 150),
        ("workers", "workers", 150, 200),
        ("frontend", "frontend", 200, 300),  # two frontend events, one span
        ("benchmark", "benchmark", 300, 900),
        ("cleanup", "benchmark", 900, 960),  # closed by completed/cleanup, which opens nothing
    )


def test_stage_durations_of_a_failed_job_end_at_the_failure(seeded):
    assert spans(seeded, "alpha", "101") == closed(
        (None, "submitted", 0, 120), ("starting", "starting", 120, 180), ("workers", "workers", 180, 400))


def test_stage_durations_of_an_active_job_leave_the_current_stage_open(seeded):
    found = spans(seeded, "beta", "100")
    assert found[:-1] == closed((None, "submitted", 0, 10), ("starting", "starting", 10, 20),
                                ("workers", "workers", 20, 70))
    stage, status, entered, left, seconds = found[-1]
    assert (stage, status, entered, left) == ("benchmark", "benchmark", BASE + dt.timedelta(seconds=70), None)
    assert seconds == pytest.approx(age(70), abs=30)
    assert rows(seeded, "SELECT count(*) FROM collector_api.stage_durations WHERE seconds < 0") == [(0,)]


# ---------------------------------------------------------------- (c) every panel's SQL

INTERVALS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def grafana_time(value: dt.datetime) -> str:
    """Go's RFC3339Nano in UTC, as Grafana renders $__timeFrom()."""
    return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def seconds_of(interval: str) -> int:
    match = re.fullmatch(r"(\d+)([smhd])", interval.strip("'"))
    assert match is not None, interval
    number, unit = match.groups()
    return int(number) * INTERVALS[unit]


def expand(query: str, clusters: list[str], interval: str = "5m") -> str:
    """The SQL Grafana's PostgreSQL data source sends: variables first, then its macros."""
    query = query.replace("$__interval", interval)
    query = re.sub(r"\$\{?cluster\}?", ",".join("'" + c.replace("'", "''") + "'" for c in clusters), query)
    start, end = (grafana_time(t) for t in RANGE)

    def macro(match: re.Match) -> str:
        # Grafana's own argument rule: split on commas, no parentheses inside.
        name, args = match[1], [a.strip() for a in match[2].split(",")]
        if name == "__timeFilter":
            return f"{args[0]} BETWEEN '{start}' AND '{end}'"
        if name == "__timeFrom":
            return f"'{start}'"
        if name == "__timeTo":
            return f"'{end}'"
        if name in ("__timeGroup", "__timeGroupAlias"):
            step = seconds_of(args[1])
            group = f"floor(extract(epoch from {args[0]})/{step})*{step}"
            return group + (' AS "time"' if name == "__timeGroupAlias" else "")
        raise AssertionError(f"macro ${name} is not one this test expands")

    query = re.sub(r"\$([_a-zA-Z0-9]+)\(([^)]*)\)", macro, query)
    assert "$" not in query, query
    return query


# The columns each panel's visualisation reads, by panel title.
PANEL_COLUMNS = {
    "Jobs submitted, by cluster and status": ["time", "metric", "jobs"],
    "Failure rate": ["time", "metric", "failure_percent"],
    "Stage durations (p50 / p95)": ["stage", "p50_seconds", "p95_seconds", "spans"],
    "Clusters": ["cluster", "active_jobs", "submitted_last_24h", "finished_last_24h", "failed_last_24h",
                 "last_report_at", "seconds_since_last_report", "health", "health_detail", "queued_jobs",
                 "running_jobs"],
    "Active jobs": ["cluster", "job_id", "job_name", "status", "stage", "message", "gpu_type", "head_node",
                    "started_at", "updated_at", "run_seconds"],
    "Recent events": ["time", "cluster", "job_id", "job_name", "status", "stage", "message", "event_id"],
}


def run_panel(conn, panel: dict, clusters: list[str]) -> tuple[list[str], list[tuple]]:
    (target,) = panel["targets"]
    result = conn.execute(text(expand(target["rawSql"], clusters, panel.get("interval", "5m"))))
    return list(result.keys()), [tuple(r) for r in result]


def test_dashboard_reads_only_the_views_through_its_data_source_variable():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["schemaVersion"] == 39
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["DS"]["type"] == "datasource"
    assert variables["cluster"]["multi"] is True and variables["cluster"]["includeAll"] is True
    assert sorted(p["title"] for p in panels()) == sorted(PANEL_COLUMNS)
    for panel in panels():
        assert panel["datasource"]["uid"] == "${DS}"
        for target in panel["targets"]:
            assert target["rawQuery"] is True and target["datasource"]["uid"] == "${DS}"
            sources = re.findall(r"\b(?:FROM|JOIN)\s+([\w.]+)", target["rawSql"], re.IGNORECASE)
            assert sources and all(s.startswith("collector_api.") for s in sources), panel["title"]


def test_cluster_variable_lists_the_clusters(seeded):
    (variable,) = [v for v in json.loads(DASHBOARD.read_text())["templating"]["list"] if v["name"] == "cluster"]
    assert rows(seeded, variable["query"]) == [("alpha",), ("beta",)]


@pytest.mark.parametrize("clusters", [["alpha", "beta"], ["alpha"], ["beta"]], ids=["All", "alpha", "beta"])
def test_every_panel_runs_and_has_the_columns_it_shows(seeded, clusters):
    with seeded.engine.connect() as conn:
        for panel in panels():
            columns, found = run_panel(conn, panel, clusters)
            assert columns == PANEL_COLUMNS[panel["title"]], panel["title"]
            fmt = panel["targets"][0]["format"]
            if fmt == "time_series":
                times = [r[0] for r in found]
                assert times == sorted(times) and all(isinstance(t, Decimal) for t in times), panel["title"]
                assert all(isinstance(r[2], (int, float, Decimal)) for r in found), panel["title"]
            if panel["type"] == "barchart":
                assert columns[0] == panel["options"]["xField"]
                assert all(isinstance(v, (int, float)) for r in found for v in r[1:]), panel["title"]
            if "cluster" in columns:
                assert {r[columns.index("cluster")] for r in found} <= set(clusters), panel["title"]
            if "alpha" in clusters:
                assert found, f"{panel['title']} returned no rows for {clusters}"


def by_title(conn, title: str, clusters: list[str]) -> list[tuple]:
    (panel,) = [p for p in panels() if p["title"] == title]
    return run_panel(conn, panel, clusters)[1]


def test_panels_show_the_seeded_numbers(seeded):
    everything = ["alpha", "beta"]
    with seeded.engine.connect() as conn:
        submitted = by_title(conn, "Jobs submitted, by cluster and status", everything)
        assert sorted((m, n) for _, m, n in submitted) == [
            ("alpha completed", 1), ("alpha failed", 1), ("alpha workers", 1), ("beta benchmark", 1)]
        assert {t for t, _, _ in submitted} == {math.floor(BASE.timestamp() / 300) * 300}

        # Failure rate in one-hour buckets of the finishing time: alpha/101 failed, alpha/100 completed.
        buckets: dict[int, list[int]] = {}
        for finished, failed in ((960, 0), (400, 1)):
            bucket = math.floor((BASE.timestamp() + finished) / 3600) * 3600
            buckets.setdefault(bucket, []).append(failed)
        assert [(int(t), m, v) for t, m, v in by_title(conn, "Failure rate", everything)] == [
            (t, "alpha", 100.0 * sum(f) / len(f)) for t, f in sorted(buckets.items())]

        durations = by_title(conn, "Stage durations (p50 / p95)", everything)
        assert [r[0] for r in durations] == ["queued", "starting", "head_infrastructure", "workers", "frontend",
                                             "benchmark", "cleanup"]
        assert durations[-2:] == [("benchmark", 600.0, 600.0, 1), ("cleanup", 60.0, 60.0, 1)]
        # Queue waits 10, 30, 60 and 120 s: p50 between 30 and 60, p95 85% of the way from 60 to 120.
        assert durations[0] == ("queued", 45.0, pytest.approx(111.0), 4)

        active = by_title(conn, "Active jobs", everything)
        assert [(r[0], r[1], r[3]) for r in active] == [("beta", "100", "benchmark"), ("alpha", "102", "workers")]
        clusters = by_title(conn, "Clusters", everything)
        assert [r[:5] for r in clusters] == [("alpha", 1, 3, 2, 1), ("beta", 1, 1, 0, 0)]
        events = by_title(conn, "Recent events", everything)
        assert len(events) == 20 and [r[-1] for r in events] == sorted((r[-1] for r in events), reverse=True)


def probe_report(api, cluster: str, **fields) -> dict:
    body = {"probed_at": at(3 * 3600), "interval_s": 30, "nodes": [{"name": "n1", "state": "idle"}],
            "partitions": [{"name": "debug", "state": "up"}], **fields}
    response = api.put(f"/api/clusters/{cluster}/status", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_cluster_health_view_agrees_with_the_api(seeded, api):
    # alpha: 102 runs, 103 waits for resources, 104 was never seen in the queue; one node drained.
    for job_id in ("103", "104"):
        body = {"job_id": job_id, "job_name": f"sweep-{job_id}", "cluster": "alpha", "submitted_at": at(500)}
        assert api.post("/api/jobs", json=body).status_code == 201
    probe_report(api, "alpha", nodes=[{"name": "n1", "state": "drained", "reason": "disk check"},
                                      {"name": "n2", "state": "mixed"}],
                 jobs=[{"job_id": "102", "state": "RUNNING"},
                       {"job_id": "103", "state": "PENDING", "reason": "Resources"}],
                 queried_job_ids=["102", "103", "104"])
    # beta: its probe failed, then went quiet (its last report arrived an hour ago).
    probe_report(api, "beta", error="sinfo: command not found", nodes=[], partitions=[])
    with seeded.engine.begin() as conn:
        conn.execute(text("UPDATE cluster_probes SET received_at = now() - interval '1 hour' WHERE cluster = 'beta'"))
    listed = {c["cluster"]: c for c in api.get("/api/clusters").json()["clusters"]}
    found = rows(seeded, "SELECT cluster, status, detail, probe_silent, reported_status, probe_interval_seconds, "
                         "probe_error, nodes, preparing_jobs, queued_jobs, running_jobs, seconds_since_probe "
                         "FROM collector_api.cluster_health ORDER BY cluster")
    assert [r[:11] for r in found] == [
        ("alpha", "degraded", "n1 drained (disk check)", False, "degraded", 30.0, None, 2, 1, 1, 1),
        ("beta", "unavailable", "sinfo: command not found", True, "unavailable", 30.0, "sinfo: command not found",
         0, 0, 0, 1),
    ]
    assert found[0][11] < 60 and 3590 < found[1][11] < 3660
    for cluster, status, _, silent, *_ in found:
        assert (listed[cluster]["status"], listed[cluster]["probe_silent"]) == (status, silent)
        phases = [job["phase"] for job in listed[cluster]["active_jobs"]]
        counts = next(r[8:11] for r in found if r[0] == cluster)
        view = dict(zip(("preparing", "queued", "running"), counts, strict=True))
        assert {phase: phases.count(phase) for phase in view} == view, cluster
    with seeded.engine.connect() as conn:
        clusters = by_title(conn, "Clusters", ["alpha", "beta"])
    assert [r[:2] + r[7:] for r in clusters] == [("alpha", 3, "degraded", "n1 drained (disk check)", 1, 1),
                                                ("beta", 1, "unavailable", "sinfo: command not found", 0, 1)]


# ---------------------------------------------------------------- (d) the read-only role

def grant(url: str, *args: str, env: Mapping[str, str | None] | None = None):
    return CliRunner().invoke(main, ["db", "grant-readonly", *args, "--db", url], env=env)


def drop_role(url: str, role: str) -> None:
    """Drop ``role`` and every privilege it holds in the database at ``url``."""
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.begin() as conn:
            if conn.execute(text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role}).first():
                driver = conn.connection.driver_connection
                assert driver is not None
                cursor = driver.cursor()
                cursor.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
                cursor.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
    finally:
        engine.dispose()


def connect_as(database, role: str, password: str) -> tuple[psycopg.Connection, str]:
    """A connection as ``role``: by password over TCP when pg_hba allows it, else SET ROLE.

    Returns the connection and how it got in: "password", "login" (pg_hba trusts
    127.0.0.1, so the password went unchecked) or "set role" (no TCP login possible).
    """
    port = database.scalar("SHOW port")
    name = make_url(database.url).database
    try:
        conn = psycopg.connect(host="127.0.0.1", port=port, dbname=name, user=role, password=password,
                               connect_timeout=5, autocommit=True)
    except psycopg.OperationalError as exc:
        assert "password authentication failed" not in str(exc), "the role's password was not set"
        # No TCP listener or no pg_hba line for it: test the privileges, not the login.
        conn = psycopg.connect(make_url(database.url).set(drivername="postgresql").render_as_string(False),
                               autocommit=True)
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
        return conn, "set role"
    try:
        psycopg.connect(host="127.0.0.1", port=port, dbname=name, user=role, password=password + "x",
                        connect_timeout=5).close()
    except psycopg.OperationalError as exc:
        assert "password authentication failed" in str(exc)
        return conn, "password"
    return conn, "login"


def delivery_of_newest_event(database, state: str = "sent") -> int:
    """A webhook subscription with one delivery of the newest event, written straight to the tables."""
    with database.engine.begin() as conn:
        hook = conn.execute(text(
            "INSERT INTO webhooks (url, statuses, clusters, secret, format, start_after, created_at) VALUES "
            "('https://hooks.example/secret-path', '[\"failed\"]', '[]', 'k', 'json', 0, now()) RETURNING id"
        )).scalar_one()
        return conn.execute(text(
            "INSERT INTO webhook_deliveries (webhook_id, event_id, state, attempts, created_at, next_attempt_at, "
            "last_status, sent_at) SELECT :hook, max(id), :state, 1, now(), now(), 200, now() FROM job_events "
            "RETURNING id"), {"hook": hook, "state": state}).scalar_one()


def test_webhook_deliveries_view_names_the_event_and_its_job_never_the_url(seeded):
    delivery = delivery_of_newest_event(seeded)
    newest = rows(seeded, "SELECT j.cluster, j.job_id, e.status FROM job_events e JOIN jobs j ON j.id = e.job_pk "
                          "ORDER BY e.id DESC LIMIT 1")[0]
    shown = rows(seeded, "SELECT delivery_id, cluster, job_id, event_status, state, attempts, last_status "
                         "FROM collector_api.webhook_deliveries")
    assert shown == [(delivery, *newest, "sent", 1, 200)]
    columns = [name for (name,) in rows(seeded, "SELECT column_name FROM information_schema.columns "
                                                "WHERE table_schema = 'collector_api' "
                                                "AND table_name = 'webhook_deliveries'")]
    assert "url" not in columns and "secret" not in columns


def test_grant_readonly_reads_the_views_and_nothing_else(seeded, api):
    probe_report(api, "alpha")  # a row for cluster_health
    delivery_of_newest_event(seeded)  # and one for webhook_deliveries
    role, password = f"grafana_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    env = {"GRAFANA_TEST_PASSWORD": password}
    try:
        first = grant(seeded.url, role, "--password-env", "GRAFANA_TEST_PASSWORD", env=env)
        assert first.exit_code == 0, first.output
        assert first.output.startswith(f"role {role} created: it can read the collector_api views of ")
        again = grant(seeded.url, role, "--password-env", "GRAFANA_TEST_PASSWORD", env=env)
        assert again.exit_code == 0 and again.output.startswith(f"role {role} updated:"), again.output
        regrant = grant(seeded.url, role)  # no password: grants only
        assert regrant.exit_code == 0 and regrant.output.startswith(f"role {role} updated:"), regrant.output

        attributes = rows(seeded, "SELECT rolcanlogin, rolsuper, rolcreatedb, rolcreaterole, "
                                  "rolpassword LIKE 'SCRAM-SHA-256$%' FROM pg_authid WHERE rolname = :r", r=role)
        assert attributes == [(True, False, False, False, True)]

        conn, how = connect_as(seeded, role, password)
        with conn:
            assert conn.execute("SELECT current_user").fetchone() == (role,)
            for view in VIEWS:
                count = conn.execute(sql.SQL("SELECT count(*) FROM collector_api.{}").format(sql.Identifier(view)))
                row = count.fetchone()
                assert row is not None
                assert row[0] == seeded.scalar(f"SELECT count(*) FROM collector_api.{view}") > 0
            for panel in panels():  # what Grafana runs, as Grafana's role
                (target,) = panel["targets"]
                conn.execute(expand(target["rawSql"], ["alpha", "beta"], panel.get("interval", "5m")))
            for table in ("jobs", "job_events", "job_counts", "job_count_stripes", "event_id_shift",
                          "blob_files", "blob_chunks", "cluster_probes",
                          "slurm_jobs", "alembic_version", "webhooks", "webhook_deliveries", "webhook_cursor",
                          "credential_uses"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(sql.SQL("SELECT 1 FROM public.{}").format(sql.Identifier(table)))
            if how != "set role":  # a login gets the role's settings; SET ROLE does not
                with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
                    conn.execute("CREATE TEMP TABLE t (x int)")

            # A view a later revision adds (created by the schema's owner) is readable at once.
            with seeded.engine.begin() as owner:
                owner.execute(text("CREATE VIEW collector_api.later_view AS SELECT 1 AS one"))
            try:
                assert conn.execute("SELECT one FROM collector_api.later_view").fetchone() == (1,)
            finally:
                with seeded.engine.begin() as owner:
                    owner.execute(text("DROP VIEW collector_api.later_view"))
    finally:
        drop_role(seeded.url, role)


@pytest.mark.parametrize("name, message", [
    ("Grafana", "is not a role name"),
    ("x'; DROP TABLE jobs; --", "is not a role name"),
    ("pg_grafana", "is reserved by PostgreSQL"),
    ("public", "is reserved by PostgreSQL"),
    ("r" * 64, "PostgreSQL allows 63"),
])
def test_grant_readonly_refuses_bad_role_names(postgres, name, message):
    result = grant(postgres.url, name, "--password-env", "P", env={"P": "secret"})
    assert result.exit_code == 2 and message in result.output, result.output
    assert rows(postgres, "SELECT count(*) FROM pg_roles WHERE rolname = :r", r=name) == [(0,)]


def test_grant_readonly_refuses_what_it_cannot_do_safely(postgres):
    role = f"grafana_{uuid.uuid4().hex[:8]}"
    missing = grant(postgres.url, role, "--password-env", "NOT_SET_ANYWHERE", env={"NOT_SET_ANYWHERE": None})
    assert missing.exit_code == 1
    assert "NOT_SET_ANYWHERE is not set or empty" in missing.output
    no_password = grant(postgres.url, role)
    assert no_password.exit_code == 1
    assert f"role {role} does not exist: pass --password-env to create it" in no_password.output
    me = postgres.scalar("SELECT current_user")
    itself = grant(postgres.url, me, "--password-env", "P", env={"P": "x"})
    assert itself.exit_code == 1
    assert f"role {me} is a superuser" in itself.output or f"role {me} is the role this command" in itself.output
    assert rows(postgres, "SELECT count(*) FROM pg_roles WHERE rolname = :r", r=role) == [(0,)]


def test_grant_readonly_refuses_sqlite(tmp_path):
    result = grant(f"sqlite:///{tmp_path / 'status.db'}", "grafana", "--password-env", "P", env={"P": "x"})
    assert result.exit_code == 1
    assert ("grant-readonly needs PostgreSQL: SQLite has no roles and no collector_api views "
            "(dashboards read PostgreSQL only)") in result.output
    assert not (tmp_path / "status.db").exists()


def test_downgrade_drops_the_views_with_their_grants(postgres, new_database):
    url = new_database()
    migrations.upgrade(url)
    role = f"grafana_{uuid.uuid4().hex[:8]}"
    engine = create_engine(url, poolclass=NullPool)
    try:
        assert grant(url, role, "--password-env", "P", env={"P": "x"}).exit_code == 0
        migrations.downgrade(url, "0003")
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM pg_namespace WHERE nspname = 'collector_api'")).scalar() == 0
        migrations.upgrade(url)
        assert sorted(inspect(engine).get_view_names(schema="collector_api")) == sorted(VIEWS)
        assert grant(url, role).exit_code == 0
    finally:
        engine.dispose()
        drop_role(url, role)
