"""/metrics: request, ingest, event, stream and pool metrics, cluster report ages, auth, gunicorn multiprocess mode."""

from __future__ import annotations

import datetime as dt
import gc
import os
import re
import runpy
import signal
import sys
import time
import weakref
from pathlib import Path

import psycopg
import pytest
import requests
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client import REGISTRY
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.mmap_dict import mmap_key
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import make_url

from collector import credentials
from collector import metrics
from collector.app import create_app
from collector.db import Database
from collector.db import get_db_of
from collector.openapi import document
from collector.settings import Settings
from collector.settings import SettingsError
from tests import sse
from tests.helpers import wait_for
from tests.processes import ROOT
from tests.processes import ServerProcess
from tests.processes import child_env
from tests.processes import run

REQUESTS = "collector_http_requests_total"
DURATION = "collector_http_request_duration_seconds"
INGESTED = "collector_ingested_bytes_total"
EVENTS = "collector_events_appended_total"
STREAMS = "collector_open_streams"
POOL = "collector_db_pool_connections"
AGE = "collector_cluster_last_report_age_seconds"
JOB_ROUTE = "/api/jobs/<job_id>"
OCTET = {"Content-Type": "application/octet-stream"}
CONFIG = ROOT / "deploy" / "gunicorn.conf.py"
GUNICORN = [sys.executable, "-m", "gunicorn", "-c", "deploy/gunicorn.conf.py", "collector.wsgi:app"]
_BOOTED = re.compile(r"Booting worker with pid: (\d+)")

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    """Every sample of an exposition, keyed by name and sorted labels."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def scrape(url: str, token: str | None = None) -> Samples:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = requests.get(url + "/metrics", headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"] == CONTENT_TYPE_LATEST
    return parse(response.text)


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def series(samples: Samples, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: v for (sample, labels), v in samples.items() if sample == name}


def stamp(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def put(url: str, job_id: str, status: str = "workers", *, token: str | None = None, cluster: str | None = None,
        updated_at: str = "2025-01-26T10:35:00Z") -> requests.Response:
    body = {"status": status, "updated_at": updated_at, **({"metadata": {"cluster": cluster}} if cluster else {})}
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return requests.put(f"{url}/api/jobs/{job_id}", json=body, headers=headers, timeout=10)


# -- what the in-process collector counts ------------------------------------------


def test_requests_are_counted_by_route_template_method_and_status(api):
    before = scrape(api.url, api.token)
    submit = {"job_id": "m-1", "job_name": "metrics", "submitted_at": "2025-01-26T10:30:00Z"}
    assert api.post("/api/jobs", json=submit).status_code == 201
    assert put(api.url, "m-1", "starting", token=api.token).status_code == 200
    assert put(api.url, "m-1", "workers", token=api.token).status_code == 200
    assert api.get("/api/jobs/no-such-job").status_code == 404
    assert api.get("/api/no/such/route").status_code == 404
    assert api.get("/api/jobs", token=None).status_code == 401
    after = scrape(api.url, api.token)

    def delta(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    expected = {
        ("/api/jobs", "POST", "201"): 1,
        (JOB_ROUTE, "PUT", "200"): 2,
        (JOB_ROUTE, "GET", "404"): 1,
        ("unmatched", "GET", "404"): 1,
        ("/api/jobs", "GET", "401"): 1,
        ("/metrics", "GET", "200"): 1,  # the first scrape; a scrape is counted after it answered
    }
    counted = {}
    for labels, n in series(after, REQUESTS).items():
        named = dict(labels)
        counted[(named["route"], named["method"], named["status"])] = n - value(before, REQUESTS, **named)
    assert {key: n for key, n in counted.items() if n} == expected
    # Templates only: no raw path (a job id) ever becomes a label. The registry is the test
    # process's, so other tests' routes are there too; each must be a rule of the app.
    rules = {rule.rule for rule in create_app(Settings(database_url="sqlite://")).url_map.iter_rules()}
    assert {route for route, _, _ in counted} <= rules | {"unmatched"}
    assert delta(DURATION + "_count", route=JOB_ROUTE, method="PUT") == 2
    assert delta(DURATION + "_bucket", route=JOB_ROUTE, method="PUT", le="+Inf") == 2
    assert 0 < delta(DURATION + "_sum", route=JOB_ROUTE, method="PUT") < 10
    # collector serve's mode: the process's ordinary registry, default collectors included.
    assert metrics.MULTIPROCESS is False
    assert any(name == "python_info" for name, _ in after)
    assert value(after, POOL, state="idle") >= 1 and (POOL, (("state", "checked_out"),)) in after
    assert value(after, "collector_database_up") == 1


def test_ingested_bytes_and_appended_events_are_counted_once(api):
    before = scrape(api.url, api.token)
    data = bytes(range(256)) * 4

    def log(offset, chunk, **params):
        return api.post("/api/jobs/m-ingest/logs", params={"file": "run.out", "offset": offset, **params},
                        data=chunk, headers=dict(OCTET))

    def capture(offset, chunk):
        return api.post("/api/jobs/m-ingest/captures", params={"file": "out-0.parquet", "offset": offset, "total": 300},
                        data=chunk, headers=dict(OCTET))

    assert log(0, data).json()["stored"] == 1  # a new job: its placeholder appends an event
    assert log(0, data).json()["stored"] == 0  # a resend stores nothing new
    assert log(len(data) - 24, data[-24:] + b"x" * 40).json()["stored"] == 1  # 40 of its 64 bytes are new
    assert log(0, b"y" * 10).status_code == 409  # rolled back: nothing counted
    assert log(len(data) + 40, b"", final=1).json()["stored"] == 1  # the final mark: a change, no bytes
    assert capture(0, b"p" * 200).json()["next_offset"] == 200
    assert capture(200, b"q" * 100).json()["complete"] is True
    assert capture(200, b"q" * 100).json()["complete"] is True  # the reporter's retry of the last chunk
    assert put(api.url, "m-ingest", "starting", token=api.token).status_code == 200
    assert put(api.url, "m-ingest", "starting", token=api.token).status_code == 200  # unchanged: no event
    after = scrape(api.url, api.token)
    feed = api.get("/api/events", params={"after": 0, "limit": 1000}).json()["events"]
    assert [(e["job_id"], e["status"]) for e in feed] == [("m-ingest", "submitted"), ("m-ingest", "starting")]
    assert value(after, INGESTED, kind="logs") - value(before, INGESTED, kind="logs") == len(data) + 40
    assert value(after, INGESTED, kind="captures") - value(before, INGESTED, kind="captures") == 300
    assert value(after, EVENTS) - value(before, EVENTS) == len(feed)


def test_cluster_report_age_is_read_at_scrape_time(api):
    base = dt.datetime.now(dt.UTC).replace(microsecond=0)
    reports = [("m-a1", "alpha", 600), ("m-a2", "alpha", 300), ("m-b1", "beta", 60), ("m-none", None, 5)]
    for job_id, cluster, seconds_ago in reports:
        assert put(api.url, job_id, token=api.token, cluster=cluster,
                   updated_at=stamp(base - dt.timedelta(seconds=seconds_ago))).status_code == 200
    samples = scrape(api.url, api.token)
    elapsed = (dt.datetime.now(dt.UTC) - base).total_seconds()
    ages = {dict(labels)["cluster"]: age for labels, age in series(samples, AGE).items()}
    assert set(ages) == {"alpha", "beta"}  # a job with no cluster belongs to none
    assert 300 <= ages["alpha"] <= 300 + elapsed  # the newest report of the cluster's jobs
    assert 60 <= ages["beta"] <= 60 + elapsed


def test_feed_held_seconds_is_the_age_of_the_oldest_write_transaction(api, database):
    if not database.is_postgres:
        # SQLite's feed never waits: the gauge is always 0.
        assert value(scrape(api.url, api.token), "collector_feed_held_seconds") == 0
        return
    assert value(scrape(api.url, api.token), "collector_feed_held_seconds") < 1
    dsn = make_url(database.url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn) as held:
        held.execute("SELECT pg_current_xact_id()")  # a write transaction left open
        time.sleep(1.2)
        assert 1.2 <= value(scrape(api.url, api.token), "collector_feed_held_seconds") < 30
        held.rollback()
    assert value(scrape(api.url, api.token), "collector_feed_held_seconds") < 1


def test_scrape_answers_while_the_database_is_down(serve):
    server = serve(database_url="postgresql+psycopg://127.0.0.1:1/nowhere")  # nothing listens on port 1
    before = scrape(server.url)
    assert server.get("/api/jobs/down-1").status_code == 503
    samples = scrape(server.url)
    assert value(samples, "collector_database_up") == 0
    assert not series(samples, AGE)
    unavailable = {"route": JOB_ROUTE, "method": "GET", "status": "503"}
    assert value(samples, REQUESTS, **unavailable) - value(before, REQUESTS, **unavailable) == 1


def test_open_streams_gauge_follows_streams(serve):
    server = serve(stream_heartbeat_s=0.2)
    before = value(scrape(server.url), STREAMS)
    streams = [sse.connect(server.url, "/api/events/stream") for _ in range(2)]
    try:
        assert [stream.status for stream in streams] == [200, 200]
        assert value(scrape(server.url), STREAMS) - before == 2
        streams[0].disconnect()  # noticed at the next heartbeat, which fails to send
        wait_for(lambda: value(scrape(server.url), STREAMS) - before == 1, what="release of the dropped stream")
    finally:
        for stream in streams:
            stream.close()
    wait_for(lambda: value(scrape(server.url), STREAMS) == before, what="release of every stream")


def pool_gauges():
    return tuple(REGISTRY.get_sample_value(POOL, {"state": state}) for state in ("checked_out", "idle"))


def test_pool_gauges_follow_checkouts_and_checkins(database):
    pool = Database(Settings(database_url=database.url))
    metrics.watch_pool(pool.engine)
    metrics.sample_pools()
    base = pool_gauges()

    def moved():
        metrics.sample_pools()
        return tuple(now - then for now, then in zip(pool_gauges(), base, strict=True))

    first, second = pool.engine.connect(), pool.engine.connect()
    assert moved() == (2, 0)
    first.close()
    assert moved() == (1, 1)
    second.close()
    assert moved() == (0, 2)
    with pool.engine.connect():
        assert moved() == (1, 1)  # an idle connection reused, none opened
    pool.dispose()
    assert moved() == (0, 0)
    # Watching an engine does not keep it alive: an app's pool goes with its app.
    gone = weakref.ref(pool.engine)
    del first, second, pool
    gc.collect()
    assert gone() is None


def test_each_process_samples_its_pools_without_a_scrape(serve):
    server = serve()
    assert server.get("/api/jobs").status_code == 200  # the first request starts the sampler thread
    assert server.app is not None
    engine = get_db_of(server.app).engine
    wait_for(lambda: pool_gauges()[0] is not None, timeout=3 * metrics.POOL_SAMPLE_S, what="a first sample")
    base = pool_gauges()
    with engine.connect():
        wait_for(lambda: pool_gauges()[0] - base[0] == 1, timeout=3 * metrics.POOL_SAMPLE_S,
                 what="the sampler to count the checked-out connection")
    wait_for(lambda: pool_gauges()[0] == base[0], timeout=3 * metrics.POOL_SAMPLE_S,
             what="the sampler to count it back in")


# -- auth and settings --------------------------------------------------------------


def test_metrics_need_a_credential_by_default_when_tokens_are_configured(serve, tmp_path):
    # No credentials at all: every route is open, /metrics too.
    assert requests.get(serve().url + "/metrics", timeout=10).status_code == 200
    # The spec's token configured: /metrics answers only a credential.
    guarded = serve(write_token="w-default", read_token="r-default")
    anonymous = requests.get(guarded.url + "/metrics", timeout=10)
    assert (anonymous.status_code, anonymous.headers["WWW-Authenticate"]) == (401, "Bearer")
    assert guarded.get("/metrics", token="r-default").status_code == 200
    # A tokens file alone does the same, and any of its credentials may scrape.
    tokens = tmp_path / "tokens.json"
    secret = credentials.add(tokens, "scraper", "read")
    from_file = serve(tokens_file=tokens)
    assert requests.get(from_file.url + "/metrics", timeout=10).status_code == 401
    assert from_file.get("/metrics", token=secret).status_code == 200
    # COLLECTOR_METRICS_AUTH=open opens it again; the API stays closed.
    settings = Settings.from_env({"COLLECTOR_METRICS_AUTH": "open", "SRTCTL_STATUS_TOKEN": "w-open"})
    reopened = serve(write_token=settings.write_token, metrics_auth=settings.metrics_auth)
    assert requests.get(reopened.url + "/metrics", timeout=10).status_code == 200
    assert reopened.get("/api/jobs", token=None).status_code == 401


def test_metrics_behind_the_tokens_when_asked(serve):
    server = serve(write_token="w-metrics", read_token="r-metrics", metrics_auth="token")
    anonymous = requests.get(server.url + "/metrics", timeout=10)
    assert (anonymous.status_code, anonymous.headers["WWW-Authenticate"]) == (401, "Bearer")
    assert anonymous.json()["detail"] == "missing bearer token"
    assert server.get("/metrics", token="wrong").status_code == 401
    assert parse(server.get("/metrics", token="r-metrics").text)
    assert server.get("/metrics", token="w-metrics").status_code == 200
    assert server.get("/api/health", token=None).status_code == 200  # the other open routes stay open


def test_metrics_auth_setting_is_read_and_checked():
    assert Settings.from_env({}).metrics_auth is None  # decided by whether tokens are configured
    assert Settings.from_env({}).metrics_open is True
    assert Settings.from_env({"SRTCTL_STATUS_TOKEN": "w"}).metrics_open is False
    assert Settings.from_env({"SRTCTL_STATUS_TOKEN": "w", "COLLECTOR_METRICS_AUTH": "open"}).metrics_open is True
    assert Settings.from_env({"COLLECTOR_METRICS_AUTH": " Token "}).metrics_auth == "token"
    with pytest.raises(SettingsError, match=r"^COLLECTOR_METRICS_AUTH must be 'open' or 'token', got 'tokens'$"):
        Settings.from_env({"COLLECTOR_METRICS_AUTH": "tokens"}).check()
    needs = r"^COLLECTOR_METRICS_AUTH=token needs credentials: set COLLECTOR_TOKENS_FILE or \$SRTCTL_STATUS_TOKEN"
    with pytest.raises(SettingsError, match=needs):
        Settings.from_env({"COLLECTOR_METRICS_AUTH": "token"}).check()
    Settings.from_env({"COLLECTOR_METRICS_AUTH": "token", "SRTCTL_STATUS_TOKEN": "w"}).check()


def test_openapi_documents_metrics_auth_as_configured():
    def metrics_operation(**settings):
        return document(create_app(Settings(database_url="sqlite://", **settings)))["paths"]["/metrics"]["get"]

    open_route = metrics_operation()
    assert open_route["security"] == [] and "401" not in open_route["responses"]
    assert list(open_route["responses"]["200"]["content"]) == ["text/plain"]
    guarded = metrics_operation(write_token="w", metrics_auth="token")
    assert "security" not in guarded and "401" in guarded["responses"]
    assert metrics_operation(write_token="w") == guarded  # the default once tokens are configured
    assert metrics_operation(write_token="w", metrics_auth="open") == open_route


# -- multiprocess mode ----------------------------------------------------------------


def test_the_mode_is_chosen_by_the_variable_at_import(tmp_path):
    code = "import collector.metrics as m; print(m.MULTIPROCESS)"
    assert run([sys.executable, "-c", code], child_env()).stdout == "False\n"
    result = run([sys.executable, "-c", code], child_env(PROMETHEUS_MULTIPROC_DIR=str(tmp_path)))
    assert result.stdout == "True\n", result.stderr
    # The metrics made at import wrote their values to this process's files.
    assert {re.sub(r"_\d+\.db$", "", p.name) for p in tmp_path.iterdir()} == {"counter", "gauge_livesum"}


def test_gunicorn_config_makes_empties_and_removes_its_own_directory(monkeypatch):
    # Empty, as a blank line in an EnvironmentFile leaves them; monkeypatch unsets them afterwards.
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "")
    monkeypatch.setenv("_COLLECTOR_OWN_METRICS_DIR", "")
    config = runpy.run_path(str(CONFIG))
    directory = Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])
    assert directory.is_dir() and directory.name.startswith("collector-metrics-")
    assert runpy.run_path(str(CONFIG)) and Path(os.environ["PROMETHEUS_MULTIPROC_DIR"]) == directory  # a reload
    (directory / "counter_1.db").write_bytes(b"stale")
    config["on_starting"](None)
    assert list(directory.iterdir()) == []
    config["on_exit"](None)
    assert not directory.exists()


def test_gunicorn_config_keeps_the_operators_directory(monkeypatch, tmp_path):
    directory = tmp_path / "prometheus" / "collector"
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))
    monkeypatch.setenv("_COLLECTOR_OWN_METRICS_DIR", "")
    config = runpy.run_path(str(CONFIG))
    assert directory.is_dir()
    (directory / "counter_1.db").write_bytes(b"stale")
    (directory / "README").write_text("not ours")
    config["on_starting"](None)
    config["on_exit"](None)
    assert [p.name for p in directory.iterdir()] == ["README"]


def booted(server: ServerProcess) -> list[int]:
    """The pids of the workers gunicorn has started, in order."""
    return list(dict.fromkeys(int(pid) for pid in _BOOTED.findall(server.output)))


def _puts_in(path: Path) -> float:
    """The PUT count recorded in one worker's counter file."""
    if not path.exists():
        return 0
    return sum(sample.value for family in MultiProcessCollector.merge([str(path)]) for sample in family.samples
               if sample.name == REQUESTS and sample.labels == {"route": JOB_ROUTE, "method": "PUT", "status": "200"})


def test_gunicorn_workers_add_up_and_a_killed_worker_keeps_its_counts(database, tmp_path):
    database.clean()
    directory = tmp_path / "prometheus"
    directory.mkdir()
    # A file of an earlier run: on_starting removes it, or the total would be off by 1000.
    stale = MmapedDict(str(directory / "counter_999999.db"))
    stale.write_value(mmap_key("collector_http_requests", REQUESTS, ["route", "method", "status"],
                               [JOB_ROUTE, "PUT", "200"], "stale"), 1000, 0)
    stale.close()
    server = ServerProcess(GUNICORN, child_env(
        COLLECTOR_DATABASE_URL=database.url, COLLECTOR_PORT="0", COLLECTOR_WORKERS="2", COLLECTOR_THREADS="4",
        COLLECTOR_MAX_STREAMS="4", PROMETHEUS_MULTIPROC_DIR=str(directory)))
    try:
        workers = wait_for(lambda: found if len(found := booted(server)) == 2 else None, what="two booted workers")
        assert not (directory / "counter_999999.db").exists()
        # Fresh connections, which the two workers accept in turn; more if one got them all.
        sent = 0
        reported = stamp(dt.datetime.now(dt.UTC) - dt.timedelta(seconds=30))
        while sent < 400:
            for _ in range(40 if sent == 0 else 20):
                assert put(server.url, f"mp-{sent}", cluster="mp", updated_at=reported).status_code == 200
                sent += 1
            per_worker = {pid: _puts_in(directory / f"counter_{pid}.db") for pid in workers}
            if all(per_worker.values()):
                break
        assert all(per_worker.values()) and sum(per_worker.values()) == sent
        samples = scrape(server.url)
        assert value(samples, REQUESTS, route=JOB_ROUTE, method="PUT", status="200") == sent
        assert value(samples, EVENTS) == sent
        assert 29 <= value(samples, AGE, cluster="mp") <= 120  # computed by the scraping worker, now
        assert value(samples, STREAMS) == 0
        # Each worker's pool as it last sampled it: both idle connections within a sampling interval.
        wait_for(lambda: value(pooled := scrape(server.url), POOL, state="idle") >= 2
                 and value(pooled, POOL, state="checked_out") == 0,
                 timeout=5 * metrics.POOL_SAMPLE_S, what="both workers' idle connections in the pool gauge")

        victim = workers[0]
        live = directory / f"gauge_livesum_{victim}.db"
        assert live.exists()
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: not live.exists(), what="child_exit dropping the dead worker's live gauges")
        wait_for(lambda: len(booted(server)) == 3, what="a replacement worker")
        samples = scrape(server.url)
        assert value(samples, REQUESTS, route=JOB_ROUTE, method="PUT", status="200") == sent
        assert value(samples, EVENTS) == sent
        assert (directory / f"counter_{victim}.db").exists()
    finally:
        assert server.stop() == 0, server.output


def test_cluster_health_and_stale_marks_are_exported(serve):
    import uuid

    api = serve(write_token="w-" + uuid.uuid4().hex, stale_grace_s=0.5)
    headers = {"Authorization": f"Bearer {api.token}"}
    before = value(scrape(api.url, api.token), "collector_stale_jobs_marked_total", rule="left_queue")
    assert requests.post(api.url + "/api/jobs", headers=headers, timeout=10, json={
        "job_id": "m-s1", "job_name": "n", "submitted_at": "2026-12-03T08:00:00Z", "cluster": "hpc"}).status_code == 201
    body = {"probed_at": stamp(dt.datetime.now(dt.UTC)), "queried_job_ids": ["m-s1"],
            "nodes": [{"name": "n1", "state": "down*"}], "partitions": [{"name": "p", "state": "up"}]}
    assert requests.put(api.url + "/api/clusters/hpc/status", json=body, headers=headers,
                        timeout=10).status_code == 200
    reported = time.monotonic()
    # A sweep past the grace period finds the job stale.
    sweep = api.janitor.sweep(now=dt.datetime.now(dt.UTC) + dt.timedelta(seconds=0.6))
    assert ([c.job_id for c in sweep.candidates], sweep.marked) == (["m-s1"], 1)
    since_report = time.monotonic() - reported
    samples = scrape(api.url, api.token)
    assert value(samples, "collector_stale_jobs_marked_total", rule="left_queue") == before + 1
    assert {dict(labels)["status"]: v for labels, v in series(samples, "collector_cluster_status").items()} == {
        "available": 0.0, "degraded": 1.0, "unavailable": 0.0}  # nodes, none usable: degraded, "; no usable nodes"
    (age,) = series(samples, "collector_cluster_probe_age_seconds").values()
    # Counted on the collector's wall clock from the last report's arrival.
    assert since_report <= age < 10
