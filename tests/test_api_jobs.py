"""/api/jobs: the built-in collector's behaviours, multi-cluster identity, and bad input."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from tests.helpers import SUBMIT
from tests.helpers import Reporter
from tests.helpers import detail
from tests.helpers import put


def timeline(job):
    return [(e["status"], e["stage"], e["message"]) for e in job["events"]]


def test_srtctl_lifecycle_reads_back_whole(api):
    reporter = Reporter(api.url, "12345", token=api.token)
    assert reporter.create("benchmark-run", cluster="b200", recipe="configs/b.yaml",
                           metadata={"tags": ["suite:x"], "model": {"container": "img:1"}})
    assert reporter.run_lifecycle(job_name="benchmark-run", cluster="b200") == [True] * 8

    job = detail(api, "12345")
    assert timeline(job) == [
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
    ids = [e["id"] for e in job["events"]]
    assert ids == sorted(ids) and len(set(ids)) == 9
    assert {e["cluster"] for e in job["events"]} == {"b200"}
    assert job["job_name"] == "benchmark-run"
    assert job["cluster"] == "b200"
    assert job["recipe"] == "configs/b.yaml"
    assert job["status"] == "completed" and job["stage"] == "cleanup"
    assert job["message"] == "Benchmark completed successfully"
    assert job["exit_code"] == 0
    assert job["logs_url"] == "s3://bucket/outputs/12345/"
    assert job["started_at"].endswith("Z") and job["completed_at"].endswith("Z")
    assert job["benchmark_results"] is None and job["artifacts"] is None
    meta = job["metadata"]
    assert meta["tags"] == ["suite:x"]
    assert meta["head_node"] == "node-01"
    assert meta["log_dir"] == "/lustre/outputs/12345/logs/12345_1P_4D"
    # Nested objects merge: the started report's model lacks the container the POST had.
    assert meta["model"] == {"container": "img:1", "path": "/models/deepseek-r1", "precision": "fp8"}
    assert meta["resources"]["gpus_per_node"] == 8


def test_post_is_201_with_submitted_and_cluster(api):
    response = api.post("/api/jobs", json=SUBMIT)
    assert response.status_code == 201
    assert response.json() == {"job_id": "12345", "status": "submitted", "cluster": "gpu-cluster-01"}
    job = detail(api, "12345")
    assert job["submitted_at"] == "2025-01-26T10:30:00Z"
    assert job["updated_at"] == "2025-01-26T10:30:00Z"
    assert job["events"] == [{"id": job["events"][0]["id"], "job_id": "12345", "cluster": "gpu-cluster-01",
                              "status": "submitted", "stage": None, "message": None,
                              "created_at": "2025-01-26T10:30:00Z", "credential": "env:write"}]


def test_repeated_post_is_201_and_changes_nothing(api):
    assert api.post("/api/jobs", json=SUBMIT).status_code == 201
    again = api.post("/api/jobs", json={**SUBMIT, "job_name": "other", "recipe": "x.yaml"})
    assert again.status_code == 201
    job = detail(api, "12345")
    assert job["job_name"] == "benchmark-run" and job["recipe"] == "configs/benchmark.yaml"
    assert len(job["events"]) == 1


def test_put_without_post_creates_placeholder_named_from_metadata(api):
    response = put(api, "777", "starting", stage="starting", message="Job started on n1",
                   started_at="2025-01-26T10:33:00Z", updated_at="2025-01-26T10:33:05Z",
                   metadata={"job_name": "sweep-a", "cluster": "b200"})
    assert response.status_code == 200
    assert response.json() == {"job_id": "777", "status": "starting", "cluster": "b200"}
    job = detail(api, "777")
    assert job["job_name"] == "sweep-a" and job["cluster"] == "b200"
    assert job["submitted_at"] == "2025-01-26T10:33:00Z"
    assert timeline(job) == [("starting", "starting", "Job started on n1")]


def test_placeholder_without_identity_is_job_id_and_no_cluster(api):
    assert put(api, "778").status_code == 200
    job = detail(api, "778")
    assert job["job_name"] == "job-778" and job["cluster"] is None


def test_late_post_repairs_identity_without_rewinding(api):
    put(api, "12345", "benchmark", stage="benchmark", message="Running benchmark",
        updated_at="2025-01-26T10:40:00Z")
    response = api.post("/api/jobs", json=SUBMIT)
    assert response.status_code == 201
    assert response.json()["status"] == "benchmark"
    job = detail(api, "12345")
    assert job["status"] == "benchmark" and job["stage"] == "benchmark"
    assert job["job_name"] == "benchmark-run"
    assert job["cluster"] == "gpu-cluster-01"
    assert job["recipe"] == "configs/benchmark.yaml"
    assert job["submitted_at"] == "2025-01-26T10:30:00Z"
    assert job["metadata"] == SUBMIT["metadata"]
    assert timeline(job) == [("benchmark", "benchmark", "Running benchmark")]


def test_repair_post_only_moves_submitted_at_earlier(api):
    api.post("/api/jobs", json=SUBMIT)
    later = api.post("/api/jobs", json={**SUBMIT, "submitted_at": "2025-01-26T12:00:00Z"})
    assert later.status_code == 201
    assert detail(api, "12345")["submitted_at"] == "2025-01-26T10:30:00Z"
    earlier = api.post("/api/jobs", json={**SUBMIT, "submitted_at": "2025-01-26T09:00:00+01:00"})
    assert earlier.status_code == 201
    assert detail(api, "12345")["submitted_at"] == "2025-01-26T08:00:00Z"


def test_repair_post_keeps_newer_metadata_and_real_name(api):
    put(api, "9", "starting", metadata={"job_name": "real", "head_node": "n2", "tags": ["new"]})
    api.post("/api/jobs", json={**SUBMIT, "job_id": "9", "job_name": "posted", "metadata": {"tags": ["old"], "x": 1}})
    job = detail(api, "9")
    # A placeholder name is replaced by the POST even when it came from metadata.
    assert job["job_name"] == "posted"
    assert job["metadata"] == {"job_name": "real", "head_node": "n2", "tags": ["new"], "x": 1}


def test_event_rule_and_silent_patches(api):
    api.post("/api/jobs", json=SUBMIT)
    put(api, "12345", "frontend", stage="frontend", message="Starting frontend")
    put(api, "12345", "frontend", stage="frontend", message="Starting frontend")
    put(api, "12345", "frontend", stage="frontend", message="Inference endpoint ready")
    # Pure metadata / artifacts patches (stage and message omitted) append nothing.
    put(api, "12345", "frontend", metadata={"k": 1})
    put(api, "12345", "frontend", artifacts={"a": "s3://x"})
    job = detail(api, "12345")
    assert timeline(job) == [
        ("submitted", None, None),
        ("frontend", "frontend", "Starting frontend"),
        ("frontend", "frontend", "Inference endpoint ready"),
    ]
    assert job["stage"] == "frontend" and job["message"] == "Inference endpoint ready"
    assert job["artifacts"] == {"a": "s3://x"} and job["metadata"]["k"] == 1


def test_new_status_without_message_drops_the_old_one(api):
    put(api, "5", "benchmark", stage="benchmark", message="Running benchmark")
    put(api, "5", "failed", exit_code=3)
    job = detail(api, "5")
    assert (job["status"], job["stage"], job["message"], job["exit_code"]) == ("failed", None, None, 3)
    assert timeline(job)[-1] == ("failed", None, None)


def test_benchmark_results_replace_artifacts_and_metadata_merge(api):
    put(api, "6", benchmark_results={"a": 1, "b": 2}, artifacts={"x": 1}, metadata={"m": {"p": 1}, "keep": "k"})
    put(api, "6", benchmark_results={"c": 3}, artifacts={"y": 2}, metadata={"m": {"q": 2}, "keep": None})
    job = detail(api, "6")
    assert job["benchmark_results"] == {"c": 3}
    assert job["artifacts"] == {"x": 1, "y": 2}
    assert job["metadata"] == {"m": {"p": 1, "q": 2}, "keep": "k"}


def test_timestamps_normalised_to_utc_z(api):
    put(api, "7", "starting", updated_at="2025-01-26T12:35:00.250+02:00", started_at="2025-01-26T10:30:00")
    job = detail(api, "7")
    assert job["updated_at"] == "2025-01-26T10:35:00.250000Z"
    assert job["started_at"] == "2025-01-26T10:30:00Z"


def test_updated_at_never_moves_back(api):
    put(api, "8", "workers", updated_at="2025-01-26T11:00:00Z")
    put(api, "8", "frontend", updated_at="2025-01-26T10:00:00Z")
    job = detail(api, "8")
    assert (job["status"], job["updated_at"]) == ("workers", "2025-01-26T11:00:00Z")
    assert timeline(job) == [("workers", None, None)]


# ---------------------------------------------------------------- late PUTs (never backwards)


def feed_ids(api):
    body = api.get("/api/events", params={"limit": 1000}).json()
    return [e["id"] for e in body["events"]]


def test_a_late_put_never_moves_a_finished_job_back(api, database):
    # The measured bug: a PUT queued behind an overload runs after the job's completed.
    api.post("/api/jobs", json=SUBMIT)
    put(api, "12345", "benchmark", stage="benchmark", message="Running benchmark", updated_at="2025-01-26T10:40:00Z")
    put(api, "12345", "completed", stage="cleanup", message="Benchmark completed successfully", exit_code=0,
        updated_at="2025-01-26T11:02:00Z")
    finished, events = detail(api, "12345"), feed_ids(api)
    late = put(api, "12345", "benchmark", stage="benchmark", message="Running benchmark",
               updated_at="2025-01-26T11:01:59Z")
    assert late.status_code == 200
    assert late.json() == {"job_id": "12345", "status": "completed", "cluster": "gpu-cluster-01"}
    job = detail(api, "12345")
    assert job == finished
    assert (job["status"], job["stage"], job["message"], job["updated_at"]) == (
        "completed", "cleanup", "Benchmark completed successfully", "2025-01-26T11:02:00Z")
    assert timeline(job) == [("submitted", None, None), ("benchmark", "benchmark", "Running benchmark"),
                             ("completed", "cleanup", "Benchmark completed successfully")]
    assert feed_ids(api) == events
    totals = {s: api.get("/api/jobs", params={"status": s}).json()["total"] for s in ("benchmark", "completed")}
    assert totals == {"benchmark": 0, "completed": 1}
    database.assert_counts_match_jobs()
    # A late POST does not rewind it either.
    assert api.post("/api/jobs", json=SUBMIT).json()["status"] == "completed"
    assert detail(api, "12345") == finished


def test_a_late_put_fills_only_what_is_still_unknown(api, database):
    put(api, "9", "completed", stage="cleanup", message="Benchmark completed successfully", exit_code=0,
        completed_at="2025-01-26T11:02:00Z", updated_at="2025-01-26T11:02:00Z",
        artifacts={"a": 1, "gap": None}, metadata={"cluster": "c", "k": "new", "m": {"p": 1}})
    late = put(api, "9", "benchmark", stage="cleanup", message="Artifacts uploaded", exit_code=1,
               started_at="2025-01-26T10:33:00Z", completed_at="2025-01-26T11:00:00Z", logs_url="s3://b/9/",
               benchmark_results={"tput": 7}, artifacts={"a": 2, "gap": "g", "b": 3},
               metadata={"cluster": "c", "k": "old", "head_node": "n1", "m": {"p": 2, "q": 3}},
               updated_at="2025-01-26T11:00:00Z")
    assert late.json() == {"job_id": "9", "status": "completed", "cluster": "c"}
    job = detail(api, "9")
    assert (job["status"], job["stage"], job["message"], job["updated_at"]) == (
        "completed", "cleanup", "Benchmark completed successfully", "2025-01-26T11:02:00Z")
    assert (job["exit_code"], job["completed_at"], job["started_at"], job["logs_url"], job["benchmark_results"]) == (
        0, "2025-01-26T11:02:00Z", "2025-01-26T10:33:00Z", "s3://b/9/", {"tput": 7})
    assert job["artifacts"] == {"a": 1, "gap": "g", "b": 3}
    assert job["metadata"] == {"cluster": "c", "k": "new", "head_node": "n1", "m": {"p": 1, "q": 3}}
    assert timeline(job) == [("completed", "cleanup", "Benchmark completed successfully")]
    # Once known, results are replaced only by a PUT that is not late.
    put(api, "9", "completed", benchmark_results={"tput": 1}, updated_at="2025-01-26T11:01:00Z")
    assert detail(api, "9")["benchmark_results"] == {"tput": 7}
    put(api, "9", "completed", benchmark_results={"tput": 8}, updated_at="2025-01-26T11:02:00Z")
    assert detail(api, "9")["benchmark_results"] == {"tput": 8}
    database.assert_counts_match_jobs()


def test_equal_stamps_apply_in_arrival_order(api, database):
    put(api, "10", "completed", stage="cleanup", message="done", updated_at="2025-01-26T11:02:00Z")
    answer = put(api, "10", "failed", stage="cleanup", message="Job failed with exit code 3", exit_code=3,
                 updated_at="2025-01-26T11:02:00Z")
    assert answer.json()["status"] == "failed"
    job = detail(api, "10")
    assert timeline(job) == [("completed", "cleanup", "done"), ("failed", "cleanup", "Job failed with exit code 3")]
    assert (job["exit_code"], job["updated_at"]) == (3, "2025-01-26T11:02:00Z")
    database.assert_counts_match_jobs()


def test_the_first_put_is_never_late_against_a_submit_or_an_upload(api, database):
    # The submitting host's clock may be ahead of the head node's: a POST's submitted_at
    # (or the collector's clock on a row a log upload created) is not a report to be behind.
    api.post("/api/jobs", json=SUBMIT)
    put(api, "12345", "starting", stage="starting", message="Job started on n1", updated_at="2025-01-26T10:29:00Z")
    put(api, "12345", "workers", stage="workers", message="Starting workers", updated_at="2025-01-26T10:29:30Z")
    job = detail(api, "12345")
    assert (job["status"], job["updated_at"]) == ("workers", "2025-01-26T10:29:30Z")
    assert timeline(job)[1:] == [("starting", "starting", "Job started on n1"),
                                 ("workers", "workers", "Starting workers")]
    assert api.post("/api/jobs/77/logs", params={"file": "a.out", "offset": 0}, data=b"x\n").status_code == 200
    assert detail(api, "77")["status"] == "submitted"
    put(api, "77", "starting", stage="starting", message="Job started on n2", updated_at="2025-01-26T10:00:00Z")
    job = detail(api, "77")
    assert (job["status"], job["updated_at"]) == ("starting", "2025-01-26T10:00:00Z")
    assert timeline(job) == [("submitted", None, None), ("starting", "starting", "Job started on n2")]
    database.assert_counts_match_jobs()


# ---------------------------------------------------------------- multi-cluster identity


def test_same_job_id_on_two_clusters_never_merges(api):
    for cluster in ("a", "b"):
        body = {**SUBMIT, "cluster": cluster, "job_name": f"on-{cluster}"}
        assert api.post("/api/jobs", json=body).status_code == 201
    put(api, "12345", "workers", stage="workers", metadata={"cluster": "a"})
    assert detail(api, "12345", cluster="a")["status"] == "workers"
    assert detail(api, "12345", cluster="b")["status"] == "submitted"
    assert detail(api, "12345", cluster="b")["job_name"] == "on-b"
    # Each row's own timeline: PostgreSQL reads the job id's events in one go and keeps the row's.
    assert [(e["status"], e["cluster"]) for e in detail(api, "12345", cluster="a")["events"]] == [
        ("submitted", "a"), ("workers", "a")]
    assert [(e["status"], e["cluster"]) for e in detail(api, "12345", cluster="b")["events"]] == [("submitted", "b")]
    listed = api.get("/api/jobs").json()
    assert listed["total"] == 2


def test_an_unclustered_read_means_the_cluster_less_row_and_shows_its_events_only(api, database):
    # A cluster-less row beside a clustered one of the same id (the API never makes that
    # pair; a restore or a hand-made row can): a read without ?cluster= means the
    # cluster-less row, with its own timeline, not the other row's.
    put(api, "555", "workers", stage="workers")
    assert api.post("/api/jobs", json={**SUBMIT, "job_id": "555x", "cluster": "x"}).status_code == 201
    with database.engine.begin() as conn:
        conn.execute(text("UPDATE jobs SET job_id = '555' WHERE job_id = '555x'"))
    shown = detail(api, "555")
    assert (shown["cluster"], shown["status"]) == (None, "workers")
    assert [(e["status"], e["cluster"]) for e in shown["events"]] == [("workers", None)]
    assert [e["status"] for e in detail(api, "555", cluster="x")["events"]] == ["submitted"]


def test_ambiguous_unclustered_read_and_write_are_409_naming_clusters(api):
    for cluster in ("b", "a"):
        api.post("/api/jobs", json={**SUBMIT, "cluster": cluster})
    for response in (api.get("/api/jobs/12345"), put(api, "12345"), api.delete("/api/jobs/12345"),
                     api.get("/api/jobs/12345/events")):
        assert response.status_code == 409, response.text
        assert response.json()["clusters"] == ["a", "b"]
        assert "a, b" in response.json()["detail"]
    assert api.get("/api/jobs/12345").json()["detail"].endswith("say which with ?cluster=")
    assert put(api, "12345").json()["detail"].endswith(
        "say which with the body's cluster (POST) or metadata.cluster (PUT)")
    assert api.get("/api/jobs").json()["total"] == 2


def test_clustered_write_claims_cluster_less_row(api):
    put(api, "42", "starting", metadata={"job_name": "n"})
    assert detail(api, "42")["cluster"] is None
    put(api, "42", "workers", metadata={"cluster": "c1"})
    job = detail(api, "42", cluster="c1")
    assert job["status"] == "workers" and job["job_name"] == "n"
    assert api.get("/api/jobs").json()["total"] == 1
    # A POST naming another cluster now creates that cluster's own row.
    api.post("/api/jobs", json={**SUBMIT, "job_id": "42", "cluster": "c2"})
    assert api.get("/api/jobs").json()["total"] == 2


def test_a_post_lands_where_a_put_would_and_makes_a_row_only_when_none_fits(api, database):
    """Each case of identity.find_for_write, through POSTs.

    On PostgreSQL a POST first tries to insert a new job in one statement; it must give way
    to the general rules whenever a row the POST lands on exists.
    """
    unclustered = {key: value for key, value in SUBMIT.items() if key != "cluster"}

    def post(**fields) -> dict:
        response = api.post("/api/jobs", json={**unclustered, "job_id": "61", **fields})
        assert response.status_code == 201, response.text
        return response.json()

    def rows() -> list[tuple]:
        with database.engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text(
                "SELECT cluster, job_name, is_placeholder, status FROM jobs WHERE job_id = '61' ORDER BY cluster"))]

    put(api, "61", "starting")
    # A cluster-less placeholder: a POST naming a cluster claims and completes it.
    assert post(cluster="c1") == {"job_id": "61", "status": "starting", "cluster": "c1"}
    assert rows() == [("c1", SUBMIT["job_name"], False, "starting")]
    # No cluster named: the job's only row, not a second one.
    assert post(job_name="other") == {"job_id": "61", "status": "starting", "cluster": "c1"}
    # Another cluster named: that cluster's own new row.
    assert post(cluster="c2") == {"job_id": "61", "status": "submitted", "cluster": "c2"}
    assert rows() == [("c1", SUBMIT["job_name"], False, "starting"), ("c2", SUBMIT["job_name"], False, "submitted")]
    assert (database.count_of("c1", "starting"), database.count_of("c2", "submitted")) == (1, 1)
    # No cluster named, two rows: which one is ambiguous.
    response = api.post("/api/jobs", json={**unclustered, "job_id": "61"})
    assert (response.status_code, response.json()["clusters"]) == (409, ["c1", "c2"])
    assert len(rows()) == 2


def test_each_write_appends_an_event_iff_its_report_changed_and_moves_a_count_iff_its_status_or_cluster_did(
        api, database):
    # (status, stage, cluster) of each PUT, then how many events the job has after it.
    steps = [
        ("starting", "starting", None, 1),  # a new row: event and count
        ("starting", "head_infrastructure", None, 2),  # an event, the same count
        ("starting", "head_infrastructure", "c1", 2),  # claimed by c1: the count moves, no event
        ("starting", "head_infrastructure", "c1", 2),  # a repeat: neither
        ("workers", "workers", "c1", 3),  # both
    ]
    for status, stage, cluster, events in steps:
        metadata = {"cluster": cluster} if cluster else {}
        assert put(api, "46", status, stage=stage, metadata=metadata).status_code == 200
        job = detail(api, "46")
        assert (job["status"], job["stage"], job["cluster"], len(job["events"])) == (status, stage, cluster, events)
        assert database.count_of(cluster or "", status) == 1
        database.assert_counts_match_jobs()


def test_reported_cluster_is_stripped_like_the_posted_one(api):
    api.post("/api/jobs", json={**SUBMIT, "job_id": "45", "cluster": " b200 "})
    put(api, "45", "workers", metadata={"cluster": "b200 "})
    listed = api.get("/api/jobs").json()
    assert listed["total"] == 1 and listed["jobs"][0]["cluster"] == "b200"
    assert listed["jobs"][0]["status"] == "workers"


def test_unclustered_write_follows_the_only_row(api):
    api.post("/api/jobs", json={**SUBMIT, "job_id": "43", "cluster": "c1"})
    # Older reporters send the cluster only in their first PUT.
    assert put(api, "43", "workers").json() == {"job_id": "43", "status": "workers", "cluster": "c1"}
    assert detail(api, "43")["status"] == "workers"


def test_unclustered_post_repairs_the_only_row_instead_of_adding_one(api):
    put(api, "44", "workers", metadata={"cluster": "c1"})
    response = api.post("/api/jobs", json={**SUBMIT, "job_id": "44", "cluster": None})
    assert response.json() == {"job_id": "44", "status": "workers", "cluster": "c1"}
    assert api.get("/api/jobs").json()["total"] == 1
    assert detail(api, "44")["job_name"] == SUBMIT["job_name"]


def test_read_with_unknown_cluster_is_404(api):
    api.post("/api/jobs", json=SUBMIT)
    response = api.get("/api/jobs/12345", params={"cluster": "nope"})
    assert response.status_code == 404
    assert response.json()["detail"] == "job 12345 not found on cluster nope"


# ---------------------------------------------------------------- list


def seed_list(api):
    for i, (cluster, status) in enumerate([("a", "submitted"), ("b", "workers"), ("a", "completed"),
                                            ("b", "completed"), ("a", "workers")]):
        api.post("/api/jobs", json={**SUBMIT, "job_id": str(100 + i), "cluster": cluster,
                                    "submitted_at": f"2025-01-26T10:0{i}:00Z"})
        if status != "submitted":
            put(api, str(100 + i), status, metadata={"cluster": cluster})


def test_list_newest_first_with_pages_and_filters(api):
    seed_list(api)
    everything = api.get("/api/jobs").json()
    assert [j["job_id"] for j in everything["jobs"]] == ["104", "103", "102", "101", "100"]
    assert (everything["total"], everything["page"], everything["per_page"]) == (5, 1, 50)
    page2 = api.get("/api/jobs", params={"page": 2, "per_page": 2}).json()
    assert [j["job_id"] for j in page2["jobs"]] == ["102", "101"]
    assert (page2["total"], page2["page"], page2["per_page"]) == (5, 2, 2)
    completed_a = api.get("/api/jobs", params={"status": "completed", "cluster": "a"}).json()
    assert [j["job_id"] for j in completed_a["jobs"]] == ["102"] and completed_a["total"] == 1
    summary = completed_a["jobs"][0]
    assert set(summary) == {"job_id", "job_name", "status", "stage", "message", "cluster", "submitted_at",
                            "started_at", "completed_at", "updated_at", "exit_code"}
    beyond = api.get("/api/jobs", params={"page": 9}).json()
    assert beyond["jobs"] == [] and beyond["total"] == 5
    oldest_b = api.get("/api/jobs", params={"cluster": "b", "order": "asc", "per_page": 1}).json()
    assert [j["job_id"] for j in oldest_b["jobs"]] == ["101"] and oldest_b["total"] == 2
    # Each summary says what the job's detail says, timestamps to the character.
    for job in everything["jobs"]:
        full = detail(api, job["job_id"], cluster=job["cluster"])
        assert job == {name: full[name] for name in job}


def test_list_per_page_up_to_the_spec_maximum(api):
    seed_list(api)
    body = api.get("/api/jobs", params={"per_page": 100}).json()
    assert (len(body["jobs"]), body["total"], body["page"], body["per_page"]) == (5, 5, 1, 100)


@pytest.mark.parametrize(
    "params, field, message",
    [
        ({"per_page": "101"}, "per_page", "Input should be less than or equal to 100"),
        ({"per_page": "1000"}, "per_page", "Input should be less than or equal to 100"),
        ({"per_page": "0"}, "per_page", "Input should be greater than or equal to 1"),
        ({"page": "0"}, "page", "Input should be greater than or equal to 1"),
        ({"page": "10000001"}, "page", "Input should be less than or equal to 10000000"),
    ],
)
def test_list_beyond_the_spec_maxima_is_422_not_clamped(api, params, field, message):
    response = api.get("/api/jobs", params=params)
    assert response.status_code == 422
    body = response.json()
    assert body["detail"] == f"invalid query: {field}: {message}"
    assert body["errors"] == [{"loc": ["query", field], "msg": message, "type": body["errors"][0]["type"]}]


@pytest.mark.parametrize(
    "params, field",
    [
        ({"page": "0"}, "page"),
        ({"page": "x"}, "page"),
        ({"per_page": "0"}, "per_page"),
        ({"per_page": "1.5"}, "per_page"),
        ({"status": "running"}, "status"),
        ({"page": str(2**70)}, "page"),
    ],
)
def test_list_bad_query_is_422_naming_the_parameter(api, params, field):
    response = api.get("/api/jobs", params=params)
    assert response.status_code == 422
    body = response.json()
    assert body["errors"][0]["loc"] == ["query", field]
    assert field in body["detail"] and body["request_id"] == response.headers["X-Request-ID"]


# ---------------------------------------------------------------- delete


def test_delete_removes_job_and_events(api, database):
    api.post("/api/jobs", json=SUBMIT)
    put(api, "12345", "workers", stage="workers")
    response = api.delete("/api/jobs/12345")
    assert response.status_code == 200
    assert response.json() == {"deleted": True, "job_id": "12345", "cluster": "gpu-cluster-01"}
    assert api.get("/api/jobs/12345").status_code == 404
    assert database.scalar("SELECT count(*) FROM job_events") == 0
    again = api.delete("/api/jobs/12345")
    assert again.status_code == 404 and again.json()["detail"] == "job 12345 not found"


def test_delete_with_cluster_removes_only_that_cluster(api):
    for cluster in ("a", "b"):
        api.post("/api/jobs", json={**SUBMIT, "cluster": cluster})
    assert api.delete("/api/jobs/12345", params={"cluster": "a"}).status_code == 200
    assert detail(api, "12345")["cluster"] == "b"


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "body, field",
    [
        ({"status": "running", "updated_at": "2025-01-26T10:35:00Z"}, "status"),
        ({"status": "workers", "stage": "warmup", "updated_at": "2025-01-26T10:35:00Z"}, "stage"),
        ({"updated_at": "2025-01-26T10:35:00Z"}, "status"),
        ({"status": "workers"}, "updated_at"),
        ({"status": "workers", "updated_at": "yesterday"}, "updated_at"),
        ({"status": "workers", "updated_at": 1737887700}, "updated_at"),
        ({"status": "workers", "updated_at": "2025-01-26T10:35:00Z", "started_at": "2025-13-01"}, "started_at"),
        ({"status": "workers", "updated_at": "2025-01-26T10:35:00Z", "exit_code": "zero"}, "exit_code"),
        ({"status": "workers", "updated_at": "2025-01-26T10:35:00Z", "metadata": ["x"]}, "metadata"),
        ({"status": "workers", "updated_at": "2025-01-26T10:35:00Z", "artifacts": "x"}, "artifacts"),
        ({"status": 3, "updated_at": "2025-01-26T10:35:00Z"}, "status"),
        ({"status": "workers", "updated_at": "2025-01-26T10:35:00Z", "exit_code": 2**40}, "exit_code"),
        ({"status": "workers", "updated_at": "2025-01-26T10:35:00Z", "metadata": {"cluster": "c" * 256}}, "metadata"),
        ({"status": "workers", "updated_at": "2025-01-26T10:35:00Z", "metadata": {"cluster": 7}}, "metadata"),
    ],
)
def test_bad_put_is_422_and_stores_nothing(api, database, body, field):
    response = api.put("/api/jobs/500", json=body)
    assert response.status_code == 422, response.text
    assert field in [e["loc"][1] for e in response.json()["errors"]]
    assert field in response.json()["detail"]
    assert database.scalar("SELECT count(*) FROM jobs") == 0


@pytest.mark.parametrize(
    "change, field",
    [
        ({"job_id": None}, "job_id"),
        ({"job_id": 12345}, "job_id"),
        ({"job_id": ""}, "job_id"),
        ({"job_id": "a/b"}, "job_id"),
        ({"job_id": "x" * 256}, "job_id"),
        ({"job_name": None}, "job_name"),
        ({"submitted_at": "2025-01-26 nope"}, "submitted_at"),
        ({"cluster": ["a"]}, "cluster"),
        ({"metadata": "tags"}, "metadata"),
    ],
)
def test_bad_post_is_422_and_stores_nothing(api, database, change, field):
    body = {k: v for k, v in {**SUBMIT, **change}.items() if v is not None}
    response = api.post("/api/jobs", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["errors"][0]["loc"] == ["body", field]
    assert database.scalar("SELECT count(*) FROM jobs") == 0


@pytest.mark.parametrize(
    "body, at",
    [
        ({"message": "a\u0000b"}, "message"),
        ({"metadata": {"log_dir": ["/ok", "/bad\u0000"]}}, "metadata.log_dir.1"),
        ({"metadata": {"bad\u0000key": 1}}, "metadata.bad\u0000key"),
    ],
)
def test_nul_characters_are_422_not_a_database_error(api, database, body, at):
    # PostgreSQL text and jsonb refuse NUL; that must be the client's error, on every backend.
    response = put(api, "nul", **body)
    assert response.status_code == 422, response.text
    assert f"text may not contain a NUL (\\u0000) character, found at {at}" in response.json()["detail"]
    assert database.scalar("SELECT count(*) FROM jobs") == 0


@pytest.mark.parametrize(
    "document, at",
    [
        ('{"metadata": {"note": "\\ud800"}}', "metadata.note"),
        ('{"metadata": {"tags": ["ok", "x\\uDFFFy"]}}', "metadata.tags.1"),
        ('{"artifacts": {"\\udbff": "key"}}', "artifacts.\\udbff"),
        ('{"benchmark_results": {"a": {"b": "\\ud83d"}}}', "benchmark_results.a.b"),
    ],
)
def test_lone_surrogates_in_documents_are_422_not_a_database_error(api, database, document, at):
    # A JSON escape of half a surrogate pair has no UTF-8 form: jsonb refused it with a 500.
    # Text fields already refuse it as a string; documents must too, on every backend.
    fields = document[1:-1]
    body = '{"status": "starting", "updated_at": "2025-01-26T10:33:00Z", ' + fields + "}"
    response = api.put("/api/jobs/surrogate", data=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 422, response.text
    assert (f"text may not contain a lone surrogate (\\ud800-\\udfff), which has no UTF-8 form, found at {at}"
            in response.json()["detail"])
    assert database.scalar("SELECT count(*) FROM jobs") == 0


def test_a_lone_surrogate_sent_as_raw_bytes_is_422(api, database):
    # Not an escape but the three bytes UTF-8 would give U+D800, which parse_body decodes
    # with surrogatepass: the body holds no backslash, so the raw-bytes check must send it to the walk.
    body = b'{"status": "starting", "updated_at": "2025-01-26T10:33:00Z", "metadata": {"note": "a\xed\xa0\x80b"}}'
    response = api.put("/api/jobs/surrogate-bytes", data=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 422, response.text
    assert "lone surrogate" in response.json()["detail"] and "metadata.note" in response.json()["detail"]
    assert database.scalar("SELECT count(*) FROM jobs") == 0


def test_a_whole_surrogate_pair_is_kept(api):
    # The escapes of both halves are one character: nothing to refuse.
    response = api.put("/api/jobs/pair", data='{"status": "starting", "updated_at": "2025-01-26T10:33:00Z",'
                       ' "metadata": {"emoji": "\\ud83d\\ude80"}}', headers={"Content-Type": "application/json"})
    assert response.status_code == 200, response.text
    assert api.get("/api/jobs/pair").json()["metadata"] == {"emoji": "\U0001f680"}


def test_text_that_only_looks_like_a_nul_escape_is_kept(api):
    # The raw body holds the characters \u0000 (an escaped backslash), which is no NUL.
    response = put(api, "not-nul", message="C:\\u0000dir")
    assert response.status_code == 200, response.text
    assert api.get("/api/jobs/not-nul").json()["message"] == "C:\\u0000dir"


@pytest.mark.parametrize("params", [{"cluster": "a\u0000"}, {"cluster": "c" * 256}])
def test_bad_cluster_parameter_is_422_everywhere(api, params):
    for response in (api.get("/api/jobs", params=params), api.get("/api/jobs/1", params=params),
                     api.get("/api/events", params=params), api.delete("/api/jobs/1", params=params)):
        assert response.status_code == 422, response.text
        assert response.json()["errors"][0]["loc"] == ["query", "cluster"]


@pytest.mark.parametrize("raw", [b"{bad", b"", b"\xff\xfe", b"[1, 2", b"nul"])
def test_invalid_json_is_400(api, database, raw):
    response = api.put("/api/jobs/1", data=raw, headers={"Content-Type": "application/json"})
    assert response.status_code == 400
    assert response.json()["detail"].startswith("body is not valid JSON")
    assert database.scalar("SELECT count(*) FROM jobs") == 0


@pytest.mark.parametrize("raw", [b"[]", b"42", b'"text"', b"null"])
def test_non_object_json_is_422(api, raw):
    response = api.post("/api/jobs", data=raw)
    assert response.status_code == 422
    assert response.json()["detail"].startswith("body must be a JSON object")


def test_unknown_job_is_404_everywhere(api):
    for response in (api.get("/api/jobs/nope"), api.get("/api/jobs/nope/events"), api.delete("/api/jobs/nope")):
        assert response.status_code == 404
        assert response.json()["detail"] == "job nope not found"


@pytest.mark.parametrize("job_id", ["9" * 300, "tab%09id", "nul%00"])
def test_bad_job_id_in_path_is_422(api, database, job_id):
    response = put(api, job_id)
    assert response.status_code == 422
    assert response.json()["detail"].startswith("invalid job id in the path: ")
    assert response.json()["errors"][0]["loc"] == ["path", "job_id"]
    assert database.scalar("SELECT count(*) FROM jobs") == 0


def test_slash_in_path_job_id_is_404(api):
    assert put(api, "a/b").status_code == 404


def test_head_is_get_without_a_body(api):
    api.post("/api/jobs", json=SUBMIT)
    get, head = api.get("/api/jobs/12345"), api.request("HEAD", "/api/jobs/12345")
    assert head.status_code == 200 and head.content == b""
    assert head.headers["Content-Length"] == get.headers["Content-Length"]


def test_unknown_fields_are_ignored(api):
    response = put(api, "31", future_field={"x": 1})
    assert response.status_code == 200
    assert "future_field" not in detail(api, "31")


def test_wrong_method_is_405_envelope(api):
    response = api.request("PATCH", "/api/jobs/1")
    assert response.status_code == 405
    assert response.json()["request_id"] == response.headers["X-Request-ID"]


def test_list_totals_follow_every_kind_of_write(api, database):
    seed_list(api)
    put(api, "900", "starting", metadata={"job_name": "p"})        # placeholder, no cluster
    put(api, "900", "workers", metadata={"cluster": "b"})          # claimed by b, status moves
    api.post("/api/jobs", json={**SUBMIT, "job_id": "900", "cluster": "b"})  # repair: nothing moves
    put(api, "104", "failed", metadata={"cluster": "a"})
    api.delete("/api/jobs/103", params={"cluster": "b"})
    database.assert_counts_match_jobs()
    for status in (None, "submitted", "workers", "completed", "failed"):
        for cluster in (None, "a", "b", "nowhere"):
            params = {k: v for k, v in {"status": status, "cluster": cluster}.items() if v}
            where = " AND ".join(f"{k} = :{k}" for k in params) or "1 = 1"
            expected = database.scalar(f"SELECT count(*) FROM jobs WHERE {where}", **params)
            assert api.get("/api/jobs", params=params).json()["total"] == expected, params


# ---------------------------------------------------------------- search and sort


def seed_search(api):
    """Six jobs on two clusters (and one with none) whose text differs in every searched column."""
    jobs = [
        ("9", "a", "Llama-70B sweep", "recipes/llama.yaml", ["suite:KV-router", "pipeline:1"]),
        ("10", "b", "deepseek_r1 50% load", None, ["suite:disagg"]),
        ("100", "a", "qwen plain", "recipes/qwen_fp8.yaml", None),
        ("11", "b", "back\\slash name", "recipes/other.yaml", "solo-tag"),
        ("12", "a", "numbers", None, [4242, {"nested": "deep"}]),
    ]
    for i, (job_id, cluster, name, recipe, tags) in enumerate(jobs):
        metadata = {"tags": tags} if tags is not None else {"model": {"path": "/m/llama"}}
        body = {"job_id": job_id, "job_name": name, "cluster": cluster, "recipe": recipe,
                "submitted_at": f"2025-01-26T10:0{i}:00Z", "metadata": metadata}
        assert api.post("/api/jobs", json=body).status_code == 201
    # Updated in another order than submitted, and statuses spread over the lifecycle.
    put(api, "9", "completed", updated_at="2025-01-26T11:09:00Z", metadata={"cluster": "a"})
    put(api, "100", "workers", updated_at="2025-01-26T11:05:00Z", metadata={"cluster": "a"})
    put(api, "11", "failed", updated_at="2025-01-26T11:07:00Z", metadata={"cluster": "b"})
    put(api, "13", "benchmark", updated_at="2025-01-26T11:01:00Z")  # placeholder, no cluster


def ids(api, **params):
    response = api.get("/api/jobs", params=params)
    assert response.status_code == 200, response.text
    return [job["job_id"] for job in response.json()["jobs"]]


@pytest.mark.parametrize(
    "q, expected",
    [
        ("10", ["100", "10"]),                    # job id substring
        ("LLAMA", ["9"]),                         # name and recipe, any case; not model.path
        ("qwen_fp8", ["100"]),                    # recipe only
        ("kv-router", ["9"]),                     # a tag, any case
        ("solo", ["11"]),                         # a lone string counts as one tag
        ("deep", ["10"]),                         # name; a nested object in tags is not a tag
        ("4242", []),                             # neither is a number
        ("50%", ["10"]),                          # % is literal
        ("_", ["100", "10"]),                     # so is _ (qwen_fp8, deepseek_r1), not "any character"
        ("\\", ["11"]),                           # and the escape character itself
        ("job-13", ["13"]),                       # a placeholder's name
        ("  suite:  ", ["10", "9"]),              # surrounding blanks are dropped
        ("nowhere", []),
    ],
)
def test_search_matches_id_name_recipe_and_tags(api, q, expected):
    seed_search(api)
    assert ids(api, q=q) == expected
    assert api.get("/api/jobs", params={"q": q}).json()["total"] == len(expected)


@pytest.mark.parametrize("q", ["Zürich", "ZÜRICH", 'say "hi"', "back\\slash", "tab\there"])
def test_search_finds_tags_that_json_stores_escaped(api, q):
    # Quotes, backslashes, controls and non-ASCII letters are escaped in the stored JSON text.
    tags = ["site:Zürich", 'note:say "hi"', "path:back\\slash", "tab\there"]
    api.post("/api/jobs", json={**SUBMIT, "job_id": "esc", "metadata": {"tags": tags}})
    api.post("/api/jobs", json={**SUBMIT, "job_id": "other", "metadata": {"tags": ["plain"]}})
    found = ids(api, q=q)
    # SQLite's LIKE folds ASCII letters only, so Ü does not match ü there.
    assert found == ([] if q == "ZÜRICH" and not api.settings.database_url.startswith("postgresql") else ["esc"])


def test_blank_search_is_no_search(api):
    seed_search(api)
    listed = api.get("/api/jobs", params={"q": "   "}).json()
    assert listed["total"] == 6 and listed["total_exact"] is True
    assert [j["job_id"] for j in listed["jobs"]] == ["13", "12", "11", "100", "10", "9"]


def test_search_combines_with_filters_and_pages(api):
    seed_search(api)
    assert ids(api, q="e", cluster="a") == ["12", "100", "9"]
    assert ids(api, q="e", cluster="a", status="workers") == ["100"]
    first = api.get("/api/jobs", params={"q": "e", "per_page": 2}).json()
    second = api.get("/api/jobs", params={"q": "e", "per_page": 2, "page": 2}).json()
    third = api.get("/api/jobs", params={"q": "e", "per_page": 2, "page": 3}).json()
    assert [j["job_id"] for j in first["jobs"] + second["jobs"] + third["jobs"]] == ["12", "11", "100", "10", "9"]
    assert (first["total"], second["total"], third["total"]) == (5, 5, 5)
    assert all(page["total_exact"] for page in (first, second, third))
    beyond = api.get("/api/jobs", params={"q": "e", "per_page": 2, "page": 9}).json()
    assert (beyond["jobs"], beyond["total"], beyond["total_exact"]) == ([], 5, True)


def test_search_total_stops_counting_at_ten_thousand(api, database):
    seed_search(api)
    # Straight into the table: ten thousand POSTs would take minutes, and the count only reads jobs.
    rows = [{"cluster": "bulk", "job_id": f"bulk-{n}", "job_name": "bulk job", "status": "submitted",
             "submitted_at": "2025-01-01 00:00:00", "updated_at": "2025-01-01 00:00:00"} for n in range(10_001)]
    with database.engine.begin() as conn:
        conn.execute(text("INSERT INTO jobs (cluster, job_id, job_name, is_placeholder, status, submitted_at, "
                          "updated_at, received_at) VALUES (:cluster, :job_id, :job_name, false, :status, "
                          ":submitted_at, :updated_at, :updated_at)"), rows)
    capped = api.get("/api/jobs", params={"q": "bulk", "per_page": 3}).json()
    assert (capped["total"], capped["total_exact"]) == (10_000, False)
    assert len(capped["jobs"]) == 3
    exact = api.get("/api/jobs", params={"q": "bulk-1000"}).json()  # bulk-1000 and bulk-10000
    assert (exact["total"], exact["total_exact"]) == (2, True)


@pytest.mark.parametrize(
    "params, expected",
    [
        ({}, ["13", "12", "11", "100", "10", "9"]),
        ({"sort": "submitted"}, ["13", "12", "11", "100", "10", "9"]),
        ({"sort": "submitted", "order": "asc"}, ["9", "10", "100", "11", "12", "13"]),
        ({"sort": "updated"}, ["9", "11", "100", "13", "12", "10"]),
        ({"sort": "updated", "order": "asc"}, ["10", "12", "13", "100", "11", "9"]),
        # Numeric ids in numeric order.
        ({"sort": "job_id"}, ["9", "10", "11", "12", "13", "100"]),
        ({"sort": "job_id", "order": "desc"}, ["100", "13", "12", "11", "10", "9"]),
        # Lifecycle order; ties newest submitted first.
        ({"sort": "status"}, ["12", "10", "100", "13", "9", "11"]),
        ({"sort": "status", "order": "desc"}, ["11", "9", "13", "100", "12", "10"]),
        # By name, the cluster-less job first (its cluster is ''); ties newest first.
        ({"sort": "cluster"}, ["13", "12", "100", "9", "11", "10"]),
        ({"sort": "cluster", "order": "desc"}, ["11", "10", "12", "100", "9", "13"]),
    ],
)
def test_sort_orders(api, params, expected):
    seed_search(api)
    assert ids(api, **params) == expected


def test_sorted_pages_partition_the_list(api):
    seed_search(api)
    for sort in ("submitted", "updated", "job_id", "status", "cluster"):
        whole = ids(api, sort=sort)
        paged = [job for page in (1, 2, 3) for job in ids(api, sort=sort, per_page=2, page=page)]
        assert paged == whole, sort


@pytest.mark.parametrize(
    "params, field, message",
    [
        ({"sort": "name"}, "sort", "Input should be 'submitted', 'updated', 'job_id', 'status' or 'cluster'"),
        ({"order": "up"}, "order", "Input should be 'asc' or 'desc'"),
        ({"q": "x" * 201}, "q", "String should have at most 200 characters"),
        ({"q": "a\u0000b"}, "q", "String should match pattern"),
    ],
)
def test_bad_search_or_sort_is_422_naming_the_allowed_values(api, params, field, message):
    response = api.get("/api/jobs", params=params)
    assert response.status_code == 422
    body = response.json()
    assert body["errors"][0]["loc"] == ["query", field]
    assert body["detail"].startswith(f"invalid query: {field}: {message}")


def test_non_finite_numbers_are_stored_as_null_and_the_report_is_kept(api):
    # Python's json.dumps writes NaN and Infinity (a reporter's metrics may hold them); JSON
    # has no such values and jsonb refuses them, so they are stored as null, never a 500.
    raw = (b'{"job_id": "nan-job", "job_name": "nan", "submitted_at": "2025-01-26T10:30:00Z",'
           b' "metadata": {"score": NaN, "ok": 1.5}}')
    assert api.post("/api/jobs", data=raw, headers={"Content-Type": "application/json"}).status_code == 201
    raw = (b'{"status": "benchmark", "updated_at": "2025-01-26T10:35:00Z", "message": "kept",'
           b' "benchmark_results": {"hi": Infinity, "lo": -Infinity, "huge": 1e999, "tiny": -1e999, "ok": 2.5e3},'
           b' "artifacts": {"nested": [NaN, 1, {"x": NaN}]}}')
    response = api.put("/api/jobs/nan-job", data=raw, headers={"Content-Type": "application/json"})
    assert response.status_code == 200, response.text

    job = detail(api, "nan-job")
    assert (job["status"], job["message"]) == ("benchmark", "kept")
    assert job["metadata"] == {"score": None, "ok": 1.5}
    assert job["benchmark_results"] == {"hi": None, "lo": None, "huge": None, "tiny": None, "ok": 2500.0}
    assert job["artifacts"] == {"nested": [None, 1, {"x": None}]}
