"""/api/clusters: job counts kept in step with writes, health from probe reports, active jobs and the stream."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from sqlalchemy import text

from collector.contract import format_timestamp
from tests import sse
from tests.helpers import SUBMIT
from tests.helpers import listing
from tests.helpers import probe_stamp
from tests.helpers import put
from tests.helpers import report
from tests.helpers import reported
from tests.helpers import submit

COUNTS = ("cluster", "total", "statuses")


def clusters(api, **kwargs):
    """The list, each entry cut to its counts (health and active jobs have tests of their own)."""
    return [{key: entry[key] for key in COUNTS} for entry in listing(api, **kwargs)]


def test_no_jobs_no_clusters(api):
    assert clusters(api) == []


def test_counts_by_cluster_and_status_follow_writes(api, database):
    for job_id, cluster in (("1", "zeta"), ("2", "alpha"), ("3", "alpha"), ("4", "Beta")):
        assert api.post("/api/jobs", json={**SUBMIT, "job_id": job_id, "cluster": cluster}).status_code == 201
    put(api, "2", "failed", metadata={"cluster": "alpha"})
    put(api, "3", "workers", metadata={"cluster": "alpha"})
    put(api, "3", "completed", metadata={"cluster": "alpha"})
    put(api, "9", "benchmark")  # a placeholder: no cluster known yet
    assert clusters(api) == [
        # Code point order ("Beta" before "alpha"), statuses in lifecycle order, the unknown cluster last.
        {"cluster": "Beta", "total": 1, "statuses": {"submitted": 1}},
        {"cluster": "alpha", "total": 2, "statuses": {"completed": 1, "failed": 1}},
        {"cluster": "zeta", "total": 1, "statuses": {"submitted": 1}},
        {"cluster": None, "total": 1, "statuses": {"benchmark": 1}},
    ]
    # The placeholder is claimed by a cluster, and a cluster loses its last job.
    put(api, "9", "benchmark", metadata={"cluster": "zeta"})
    assert api.delete("/api/jobs/4").status_code == 200
    listed = clusters(api)
    assert listed == [
        {"cluster": "alpha", "total": 2, "statuses": {"completed": 1, "failed": 1}},
        {"cluster": "zeta", "total": 2, "statuses": {"submitted": 1, "benchmark": 1}},
    ]
    assert list(listed[1]["statuses"]) == ["submitted", "benchmark"]  # lifecycle, not the alphabet
    database.assert_counts_match_jobs()


def test_needs_a_token_like_every_read(api):
    api.post("/api/jobs", json=SUBMIT)
    missing = api.get("/api/clusters", token=False)
    assert missing.status_code == 401 and missing.headers["WWW-Authenticate"] == "Bearer"
    assert missing.json()["detail"] == "missing bearer token"
    assert clusters(api, token=api.settings.read_token) == [
        {"cluster": "gpu-cluster-01", "total": 1, "statuses": {"submitted": 1}}]


def test_open_collector_answers_without_a_token(serve):
    server = serve()
    server.post("/api/jobs", json=SUBMIT)
    assert clusters(server, token=False) == [{"cluster": "gpu-cluster-01", "total": 1, "statuses": {"submitted": 1}}]


def test_write_method_is_405(api):
    response = api.post("/api/clusters", json={})
    assert response.status_code == 405 and response.headers["Allow"] == "GET, HEAD, OPTIONS"


def test_a_cluster_never_probed_has_no_health_and_lists_its_active_jobs(api):
    submit(api, "1")
    submit(api, "2", submitted_at="2026-12-03T09:00:00Z")
    put(api, "2", "workers", metadata={"cluster": "c1"}, started_at="2026-12-03T09:05:00Z")
    submit(api, "3")
    put(api, "3", "completed", metadata={"cluster": "c1"})
    assert listing(api) == [{
        "cluster": "c1", "total": 3, "statuses": {"submitted": 1, "workers": 1, "completed": 1},
        "status": None, "detail": None, "probed_at": None, "probe_silent": False,
        # Newest first; the finished job is not active.
        "active_jobs": [
            {"job_id": "2", "job_name": "n-2", "status": "workers", "phase": "running", "reason": None,
             "since": "2026-12-03T09:05:00Z", "slurm_state": None},
            {"job_id": "1", "job_name": "n-1", "status": "submitted", "phase": "preparing", "reason": None,
             "since": "2026-12-03T08:00:00Z", "slurm_state": None},
        ],
    }]


def test_a_probe_report_sets_health_and_answers_with_the_jobs_to_watch(api):
    submit(api, "7")
    submit(api, "8")
    put(api, "8", "failed", metadata={"cluster": "c1"})
    probed_at = probe_stamp()
    answer = reported(api, probed_at=probed_at,
                      nodes=[{"name": "n1", "state": "drained", "reason": "disk check"},
                             {"name": "n2", "state": "mixed"}],
                      partitions=[{"name": "debug", "state": "up"}, {"name": "gpu", "state": "down"}])
    expected = {
        "cluster": "c1", "total": 2, "statuses": {"submitted": 1, "failed": 1}, "status": "degraded",
        "detail": "n1 drained (disk check); partition gpu down", "probed_at": probed_at, "probe_silent": False,
        "active_jobs": [{"job_id": "7", "job_name": "n-7", "status": "submitted", "phase": "preparing",
                         "reason": None, "since": "2026-12-03T08:00:00Z", "slurm_state": None}],
    }
    assert answer == {**expected, "watch": ["7"]}
    assert listing(api) == [expected]
    assert api.get("/api/clusters/c1/status").json() == {**expected, "watch": ["7"]}
    # The read token reads it too (the UI, a dashboard); only the write token reports.
    assert api.get("/api/clusters/c1/status", token=api.settings.read_token).json()["detail"] == expected["detail"]
    # The next report replaces it.
    assert reported(api)["status"] == "available" and listing(api)[0]["detail"] is None


def test_a_cluster_only_the_probe_knows_is_listed(api):
    reported(api, "empty", nodes=[])
    (entry,) = listing(api)
    assert (entry["cluster"], entry["total"], entry["statuses"], entry["status"], entry["detail"],
            entry["active_jobs"]) == ("empty", 0, {}, "unavailable", "no compute nodes registered", [])


def test_a_failed_probe_is_unavailable_with_the_first_line_of_its_error(api):
    error = "slurm_load_partitions: Unable to contact slurm controller (connect failure)\nsecond line"
    answer = reported(api, error=error, nodes=[], partitions=[])
    assert (answer["status"], answer["detail"]) == (
        "unavailable", "slurm_load_partitions: Unable to contact slurm controller (connect failure)")
    long = reported(api, error="x" * 500)
    assert long["detail"] == "x" * 200


def test_queue_reason_reaches_the_clusters_and_the_job_detail(api, database):
    submit(api, "41")
    submit(api, "42")
    answer = reported(api, jobs=[{"job_id": "41", "state": "PENDING", "reason": "Resources"},
                                 {"job_id": "42", "state": "RUNNING", "reason": "None"}],
                      queried_job_ids=["41", "42"])
    phases = {job["job_id"]: (job["phase"], job["reason"], job["slurm_state"]) for job in answer["active_jobs"]}
    assert phases == {"41": ("queued", "Resources", "PENDING"), "42": ("running", None, "RUNNING")}
    queued = {job["job_id"]: job for job in answer["active_jobs"]}["41"]
    assert queued["since"] == "2026-12-03T08:00:00Z"  # first seen waiting: waiting since submission
    slurm = api.get("/api/jobs/41").json()["slurm"]
    assert (slurm["state"], slurm["reason"], slurm["since"], slurm["gone_since"]) == (
        "PENDING", "Resources", "2026-12-03T08:00:00Z", None)
    # The reason follows Slurm's; once running there is none.
    reported(api, jobs=[{"job_id": "41", "state": "PENDING", "reason": "Priority"}], queried_job_ids=["41"])
    assert api.get("/api/jobs/41").json()["slurm"]["reason"] == "Priority"
    reported(api, jobs=[{"job_id": "41", "state": "RUNNING"}], queried_job_ids=["41"])
    running = {job["job_id"]: job for job in listing(api)[0]["active_jobs"]}["41"]
    assert (running["phase"], running["reason"]) == ("running", None)
    assert running["since"] > "2026-12-03T08:00:00Z"  # the probe that first saw it running
    # A job no probe asked about has no slurm view; another cluster's same id is not touched.
    submit(api, "41", cluster="other")
    assert api.get("/api/jobs/41", params={"cluster": "other"}).json()["slurm"] is None


def test_a_probe_that_stopped_reporting_shows_it(api, database):
    reported(api, interval_s=30)
    assert listing(api)[0]["probe_silent"] is False
    last = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(minutes=10)
    with database.engine.begin() as conn:  # ten minutes without a report
        conn.execute(text("UPDATE cluster_probes SET received_at = :t"), {"t": last.replace(tzinfo=None)
                                                                          if not database.is_postgres else last})
    (entry,) = listing(api)
    assert (entry["status"], entry["probe_silent"]) == ("unavailable", True)
    assert entry["detail"] == (f"probe silent since {format_timestamp(last)} (expected every 30 s); "
                               "last report: available")
    assert reported(api)["probe_silent"] is False


@pytest.mark.parametrize(("path", "body", "status", "detail"), [
    ("/api/clusters/c1/status", {"nodes": []}, 422, "invalid body: probed_at: Field required"),
    ("/api/clusters/c1/status", {"probed_at": "yesterday"}, 422,
     "invalid body: probed_at: Value error, not an ISO 8601 timestamp: 'yesterday'"),
    ("/api/clusters/c1/status", {"probed_at": "2026-12-03T08:00:00Z", "nodes": "n1"}, 422,
     "invalid body: nodes: Input should be a valid list"),
    ("/api/clusters/c1/status", {"probed_at": "2026-12-03T08:00:00Z", "nodes": [{"name": "n1"}]}, 422,
     "invalid body: nodes.0.state: Field required"),
    ("/api/clusters/c1/status", {"probed_at": "2026-12-03T08:00:00Z", "interval_s": 0}, 422,
     "invalid body: interval_s: Input should be greater than or equal to 1"),
    ("/api/clusters/c1/status", {"probed_at": "2026-12-03T08:00:00Z", "jobs": [{"job_id": "a/b", "state": "X"}]},
     422, "invalid body: jobs.0.job_id: String should match pattern '^[^\\x00-\\x1f\\x7f/]+$'"),
    ("/api/clusters/c%01/status", {"probed_at": "2026-12-03T08:00:00Z"}, 422,
     "invalid cluster in the path: String should match pattern '^[^\\x00-\\x1f\\x7f/]+$'"),
    ("/api/clusters/" + "c" * 256 + "/status", {"probed_at": "2026-12-03T08:00:00Z"}, 422,
     "invalid cluster in the path: String should have at most 255 characters"),
    ("/api/clusters/a/b/status", {"probed_at": "2026-12-03T08:00:00Z"}, 404, None),
])
def test_bad_reports_are_refused_and_store_nothing(api, path, body, status, detail):
    response = api.put(path, json=body)
    assert response.status_code == status, response.text
    if detail is not None:
        assert response.json()["detail"] == detail
    assert listing(api) == []


def test_reports_need_the_write_token_and_a_sane_body(api):
    assert report(api, token=False).status_code == 401
    refused = report(api, token=api.settings.read_token)
    assert (refused.status_code, refused.json()["detail"]) == (403, "the read token cannot write; use the write token")
    not_json = api.put("/api/clusters/c1/status", data=b"{", headers={"Content-Type": "application/json"})
    assert not_json.status_code == 400 and not_json.json()["detail"].startswith("body is not valid JSON")
    huge = api.put("/api/clusters/c1/status", data=b"x" * (1024 * 1024 + 1))
    assert huge.status_code == 413
    assert api.get("/api/clusters/c1/status", token=False).status_code == 401
    assert listing(api) == []
    # A cluster nobody reported yet reads as empty (a probe's first question), not as a 404.
    assert api.get("/api/clusters/c1/status").json() == {
        "cluster": "c1", "total": 0, "statuses": {}, "status": None, "detail": None, "probed_at": None,
        "probe_silent": False, "active_jobs": [], "watch": []}


@pytest.fixture
def streamer(serve):
    """A collector whose idle streams heartbeat every 0.3 s, and a factory of cluster streams on it."""
    server = serve(write_token="w-" + uuid.uuid4().hex, read_token="r-" + uuid.uuid4().hex,
                   stream_heartbeat_s=0.3, stream_poll_s=0.1)
    opened = []

    def open_stream(token=None):
        stream = sse.connect(server.url, "/api/clusters/stream", token=token or server.settings.read_token)
        opened.append(stream)
        return stream

    yield server, open_stream
    for stream in opened:
        stream.close()


def test_the_cluster_stream_sends_every_cluster_then_each_change(streamer):
    server, open_stream = streamer
    submit(server, "1", cluster="a")
    reported(server, "b")
    stream = open_stream()
    first = stream.events(2)
    assert [(f.event, f.id) for f in first] == [("cluster-status", None), ("cluster-status", None)]
    assert [f.json() for f in first] == listing(server)
    assert stream.comments == ["collector cluster stream"]
    # A new report changes b only: one event, for b.
    reported(server, "b", nodes=[{"name": "n1", "state": "down*", "reason": "Not responding"}])
    (changed,) = stream.events(1, timeout=5)
    assert (changed.json()["cluster"], changed.json()["status"], changed.json()["detail"]) == (
        "b", "degraded", "n1 down* (Not responding); no usable nodes")
    # A job event changes a's counts and active jobs.
    put(server, "1", "workers", metadata={"cluster": "a"})
    (moved,) = stream.events(1, timeout=5)
    assert (moved.json()["cluster"], moved.json()["statuses"], moved.json()["active_jobs"][0]["phase"]) == (
        "a", {"workers": 1}, "running")
    # Nothing changes: heartbeats only.
    assert {f.event for f in stream.quiet_for(0.8)} == {"heartbeat"}


def test_the_cluster_stream_needs_a_token_and_a_free_slot(serve):
    server = serve(write_token="w-" + uuid.uuid4().hex, max_streams=0)
    assert server.get("/api/clusters/stream", token=False).status_code == 401
    full = server.get("/api/clusters/stream")
    assert full.status_code == 503 and full.headers["Retry-After"] == "5"
    assert "maximum of 0 streams" in full.json()["detail"]
