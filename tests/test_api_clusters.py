"""/api/clusters: every known cluster with its job counts by status, kept in step with writes."""

from __future__ import annotations

from tests.test_api_jobs import SUBMIT
from tests.test_api_jobs import put


def clusters(api, **kwargs):
    response = api.get("/api/clusters", **kwargs)
    assert response.status_code == 200, response.text
    return response.json()["clusters"]


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
