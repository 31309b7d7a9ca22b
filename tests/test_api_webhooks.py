"""``/api/webhooks``: subscriptions added, listed and removed by admins, bad input refused by field."""

from __future__ import annotations

import pytest

from collector.credentials import ENV_WRITE
from tests.helpers import put
from tests.helpers import submit

HOOK = "https://hooks.example/collector?team=gpu"


def hooks(api) -> list[dict]:
    response = api.get("/api/webhooks")
    assert response.status_code == 200, response.text
    return response.json()["webhooks"]


def test_an_admin_subscribes_and_nobody_sees_the_secret_again(api, database):
    response = api.post("/api/webhooks", json={
        "url": HOOK, "statuses": ["failed", "timeout", "failed"], "clusters": ["b200", "h100", "b200"],
        "secret": "s3cret-value", "format": "slack"})
    assert response.status_code == 201, response.text
    created = response.json()
    assert created.pop("created_at").endswith("Z")
    assert created == {"id": 1, "url": HOOK, "statuses": ["failed", "timeout"], "clusters": ["b200", "h100"],
                       "format": "slack", "signed": True, "enabled": True, "disabled_reason": None,
                       "created_by": ENV_WRITE}
    listed = api.get("/api/webhooks")
    assert "s3cret-value" not in listed.text and "secret" not in listed.json()["webhooks"][0]
    assert [{k: v for k, v in hook.items() if k != "created_at"} for hook in listed.json()["webhooks"]] == [created]
    # Kept for signing.
    assert database.scalar("SELECT secret FROM webhooks WHERE id = 1") == "s3cret-value"


def test_defaults_are_finished_jobs_on_every_cluster_in_json_unsigned(api):
    created = api.post("/api/webhooks", json={"url": "http://127.0.0.1:9/hook"}).json()
    assert {k: created[k] for k in ("statuses", "clusters", "format", "signed")} == {
        "statuses": ["completed", "failed", "timeout"], "clusters": [], "format": "json", "signed": False}


def test_a_subscription_hears_only_of_events_after_it(api, database):
    submit(api, "wh-1", cluster="b200")
    assert put(api, "wh-1", status="starting", metadata={"cluster": "b200"}).status_code == 200
    newest = database.scalar("SELECT max(id) FROM job_events")
    hook = api.post("/api/webhooks", json={"url": HOOK}).json()
    assert database.scalar("SELECT start_after FROM webhooks WHERE id = :i", i=hook["id"]) == newest


@pytest.mark.parametrize(("body", "loc", "message"), [
    ({}, ["body", "url"], "Field required"),
    ({"url": 5}, ["body", "url"], "Input should be a valid string"),
    ({"url": "ftp://files.example/x"}, ["body", "url"], "Value error, must be an http:// or https:// URL, not ftp"),
    ({"url": "hooks.example/x"}, ["body", "url"], "Value error, must be an http:// or https:// URL, not one without"),
    ({"url": "https:///path-only"}, ["body", "url"], "Value error, must name a host"),
    ({"url": "https://hooks.example/a b"}, ["body", "url"], "Value error, must not hold whitespace or control"),
    ({"url": "https://h.example/" + "x" * 2048}, ["body", "url"], "String should have at most 2048 characters"),
    ({"url": HOOK, "statuses": ["exploded"]}, ["body", "statuses", "0"], "Input should be 'submitted'"),
    ({"url": HOOK, "statuses": []}, ["body", "statuses"], "List should have at least 1 item"),
    ({"url": HOOK, "statuses": "failed"}, ["body", "statuses"], "Input should be a valid list"),
    ({"url": HOOK, "clusters": ["a/b"]}, ["body", "clusters", "0"], "String should match pattern"),
    ({"url": HOOK, "secret": ""}, ["body", "secret"], "String should have at least 1 character"),
    ({"url": HOOK, "format": "teams"}, ["body", "format"], "Input should be 'json' or 'slack'"),
    ({"url": HOOK, "colour": "red"}, ["body", "colour"], "Extra inputs are not permitted"),
])
def test_bad_input_is_a_422_that_names_the_field_and_stores_nothing(api, body, loc, message):
    response = api.post("/api/webhooks", json=body)
    assert response.status_code == 422, response.text
    error = response.json()["errors"][0]
    assert error["loc"] == loc and error["msg"].startswith(message), error
    assert ".".join(loc[1:]) in response.json()["detail"]
    assert hooks(api) == []


@pytest.mark.parametrize(("body", "status", "detail"), [
    (b"{not json", 400, "body is not valid JSON"),
    (b"[1]", 422, "body must be a JSON object, got list"),
])
def test_a_body_that_is_no_object_is_refused(api, body, status, detail):
    response = api.post("/api/webhooks", data=body, headers={"Content-Type": "application/json"})
    assert (response.status_code, response.json()["detail"][:len(detail)]) == (status, detail)
    assert hooks(api) == []


def test_removing_answers_the_subscription_as_it_was_and_then_404(api):
    kept = api.post("/api/webhooks", json={"url": HOOK}).json()
    gone = api.post("/api/webhooks", json={"url": "https://other.example/x", "secret": "k"}).json()
    response = api.delete(f"/api/webhooks/{gone['id']}")
    assert (response.status_code, response.json()) == (200, gone)
    assert hooks(api) == [kept]
    again = api.delete(f"/api/webhooks/{gone['id']}")
    assert (again.status_code, again.json()["detail"]) == (404, f"no webhook {gone['id']}")


@pytest.mark.parametrize("path", ["/api/webhooks/0", "/api/webhooks/99999999999999999999", "/api/webhooks/abc",
                                  "/api/webhooks/-1", "/api/webhooks/1%2F..%2F2"])
def test_an_unknown_or_hostile_id_is_a_404(api, path):
    api.post("/api/webhooks", json={"url": HOOK})
    response = api.delete(path)
    assert response.status_code == 404, response.text
    assert response.headers["Content-Type"] == "application/json"
    assert len(hooks(api)) == 1


def test_a_scoped_writer_or_a_reader_may_neither_add_nor_see_subscriptions(api, serve, tmp_path):
    # (every credential kind against every route: tests/test_auth_matrix.py)
    api.post("/api/webhooks", json={"url": HOOK})
    read_token = api.settings.read_token
    listed = api.get("/api/webhooks", token=read_token)
    assert (listed.status_code, listed.json()["detail"]) == (
        403, "the read token cannot manage webhooks: that needs an admin credential or the write token")
    assert HOOK not in listed.text
    refused = api.post("/api/webhooks", json={"url": "https://evil.example/"}, token=read_token)
    assert refused.status_code == 403
    assert [hook["url"] for hook in hooks(api)] == [HOOK]


def test_an_open_server_lets_anyone_manage_subscriptions(serve):
    # The laptop default: loopback, no tokens.
    open_api = serve()
    created = open_api.post("/api/webhooks", json={"url": HOOK}, token=False)
    assert created.status_code == 201 and created.json()["created_by"] is None
    assert open_api.delete(f"/api/webhooks/{created.json()['id']}", token=False).status_code == 200
