"""/api/events and /api/jobs/{id}/events: cursors, filters and limits."""

from __future__ import annotations

import pytest


def submit(api, job_id, cluster):
    response = api.post("/api/jobs", json={"job_id": job_id, "job_name": f"n-{job_id}", "cluster": cluster,
                                           "submitted_at": "2025-01-26T10:30:00Z"})
    assert response.status_code == 201


def put(api, job_id, status, cluster=None, message=None):
    body = {"status": status, "updated_at": "2025-01-26T10:35:00Z", "message": message,
            "metadata": {"cluster": cluster} if cluster else None}
    response = api.put(f"/api/jobs/{job_id}", json={k: v for k, v in body.items() if v is not None})
    assert response.status_code == 200, response.text


@pytest.fixture
def seeded(api):
    submit(api, "1", "a")
    submit(api, "2", "b")
    put(api, "1", "workers")
    submit(api, "1", "b")  # same id, another cluster
    put(api, "2", "workers", cluster="b")
    put(api, "1", "frontend", cluster="b")
    return api


def feed(api, **params):
    response = api.get("/api/events", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def keys(body):
    return [(e["job_id"], e["cluster"], e["status"]) for e in body["events"]]


def test_global_feed_in_id_order(seeded):
    body = feed(seeded)
    assert keys(body) == [("1", "a", "submitted"), ("2", "b", "submitted"), ("1", "a", "workers"),
                          ("1", "b", "submitted"), ("2", "b", "workers"), ("1", "b", "frontend")]
    ids = [e["id"] for e in body["events"]]
    assert ids == sorted(ids) and body["next_cursor"] == ids[-1]
    assert set(body["events"][0]) == {"id", "job_id", "cluster", "status", "stage", "message", "created_at",
                                      "credential"}
    assert {e["credential"] for e in body["events"]} == {"env:write"}  # who wrote each: the spec's write token


def test_poll_loop_follows_next_cursor(seeded):
    seen: list[int] = []
    after = 0
    for _ in range(10):
        body = feed(seeded, after=after, limit=2)
        if not body["events"]:
            assert body["next_cursor"] == after
            break
        assert len(body["events"]) <= 2
        seen.extend(e["id"] for e in body["events"])
        after = body["next_cursor"]
    assert len(seen) == 6 and seen == sorted(set(seen))


def test_next_cursor_is_null_on_an_empty_feed(api):
    assert feed(api) == {"events": [], "next_cursor": None}
    assert feed(api, after=0) == {"events": [], "next_cursor": None}
    assert feed(api, after=41) == {"events": [], "next_cursor": 41}


def test_feed_filters(seeded):
    assert keys(feed(seeded, job_id="1")) == [("1", "a", "submitted"), ("1", "a", "workers"),
                                              ("1", "b", "submitted"), ("1", "b", "frontend")]
    assert keys(feed(seeded, cluster="b")) == [("2", "b", "submitted"), ("1", "b", "submitted"),
                                               ("2", "b", "workers"), ("1", "b", "frontend")]
    assert keys(feed(seeded, job_id="1", cluster="a")) == [("1", "a", "submitted"), ("1", "a", "workers")]
    assert feed(seeded, job_id="nope") == {"events": [], "next_cursor": None}


def test_limit_up_to_the_spec_maximum(seeded):
    assert keys(feed(seeded, limit=1000)) == keys(feed(seeded))
    body = seeded.get("/api/jobs/2/events", params={"limit": 1000}).json()
    assert [e["status"] for e in body["events"]] == ["submitted", "workers"]


@pytest.mark.parametrize(
    "path, params",
    [("/api/events", {"limit": "1001"}), ("/api/events", {"limit": "5000"}), ("/api/events", {"limit": "0"}),
     ("/api/jobs/2/events", {"limit": "1001"}), ("/api/jobs/2/events", {"limit": "0"})],
)
def test_limit_beyond_the_spec_maxima_is_422_not_clamped(seeded, path, params):
    response = seeded.get(path, params=params)
    assert response.status_code == 422
    body = response.json()
    message = ("Input should be less than or equal to 1000" if int(params["limit"])
               else "Input should be greater than or equal to 1")
    assert body["detail"] == f"invalid query: limit: {message}"
    assert [(e["loc"], e["msg"]) for e in body["errors"]] == [(["query", "limit"], message)]


def test_job_feed_needs_cluster_when_ambiguous(seeded):
    assert seeded.get("/api/jobs/1/events").status_code == 409
    body = seeded.get("/api/jobs/1/events", params={"cluster": "b"}).json()
    assert body["job_id"] == "1" and body["cluster"] == "b"
    assert [e["status"] for e in body["events"]] == ["submitted", "frontend"]
    first = body["events"][0]["id"]
    rest = seeded.get("/api/jobs/1/events", params={"cluster": "b", "after": first}).json()
    assert [e["status"] for e in rest["events"]] == ["frontend"]
    assert rest["next_cursor"] == body["events"][1]["id"]
    done = seeded.get("/api/jobs/1/events", params={"cluster": "b", "after": rest["next_cursor"]}).json()
    assert done["events"] == [] and done["next_cursor"] == rest["next_cursor"]


def test_job_feed_limit(seeded):
    body = seeded.get("/api/jobs/2/events", params={"limit": 1}).json()
    assert [e["status"] for e in body["events"]] == ["submitted"]
    assert body["next_cursor"] == body["events"][0]["id"]


@pytest.mark.parametrize(
    "params, field",
    [({"after": "-1"}, "after"), ({"after": "x"}, "after"), ({"limit": "0"}, "limit"),
     ({"limit": "-5"}, "limit"), ({"after": str(2**63)}, "after"), ({"job_id": "x" * 300}, "job_id")],
)
def test_bad_feed_query_is_422(api, params, field):
    response = api.get("/api/events", params=params)
    assert response.status_code == 422
    assert response.json()["errors"][0]["loc"] == ["query", field]


@pytest.mark.parametrize("params", [{"after": "-1"}, {"limit": "abc"}])
def test_bad_job_feed_query_is_422(seeded, params):
    response = seeded.get("/api/jobs/2/events", params=params)
    assert response.status_code == 422


def test_ids_of_deleted_events_are_never_reused(api):
    submit(api, "1", "a")
    put(api, "1", "workers")
    newest = feed(api)["next_cursor"]
    assert api.delete("/api/jobs/1").status_code == 200
    submit(api, "2", "a")
    body = feed(api, after=newest)
    # A poller that had seen `newest` still gets the new job's event.
    assert [e["job_id"] for e in body["events"]] == ["2"] and body["events"][0]["id"] > newest
