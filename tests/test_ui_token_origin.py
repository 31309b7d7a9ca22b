"""The page keeps each token for the API origin it was entered for (issue 16), in a real browser.

A link with #api= naming another origin asks before the page switches; the token is only
ever sent to its own origin. The "other collector" is a Recorder in front of a second real
collector: it answers the browser's CORS preflights itself and records every request, so
a token sent its way would be seen (tests/test_ui.py has the rest of the page's tests).
"""

from __future__ import annotations

import re

import pytest

from tests.helpers import Recorder
from tests.helpers import put
from tests.helpers import submit
from tests.helpers import wait_for

FAST = {"stream_poll_s": 0.1, "stream_heartbeat_s": 5.0}
STORAGE = "() => Object.fromEntries(Object.entries(localStorage))"


@pytest.fixture
def collector(serve):
    """The collector that serves the page, with its read token r-ui, and two jobs."""
    here = serve(write_token="w-ui", read_token="r-ui", **FAST)
    for job_id in ("1000", "1001"):
        submit(here, job_id, "b200")
    return here


@pytest.fixture
def elsewhere(serve, second_database, recorder) -> Recorder:
    """Another collector (read token r-there, job 2000) behind a Recorder that allows any origin."""
    there = serve(database_url=second_database, write_token="w-there", read_token="r-there", **FAST)
    submit(there, "2000", "gb300")

    def answer(request, rec):
        cors = {"Access-Control-Allow-Origin": request.headers.get("Origin", "*"),
                "Access-Control-Allow-Headers": "authorization, accept", "Access-Control-Allow-Methods": "GET",
                "Access-Control-Max-Age": "0", "Vary": "Origin"}
        if request.method == "OPTIONS":
            return 204, cors, b""
        if request.path.endswith("/stream"):
            # The Recorder answers whole bodies only: no streams here, so the page polls.
            return 503, {"Content-Type": "application/json", **cors}, b'{"detail": "no streams here"}'
        status, headers, body = rec.forwarded(request)
        return status, {**headers, **cors}, body

    return recorder(there.url, answer)


def bearer(request) -> str | None:
    return next((value for name, value in request.headers.items() if name.lower() == "authorization"), None)


def authorized(rec: Recorder) -> list[str]:
    """Every Authorization header the recorder saw, and every preflight that asked to send one."""
    seen = [value for r in rec.requests if (value := bearer(r)) is not None]
    asked = [f"preflight {r.path}" for r in rec.of("OPTIONS")
             if "authorization" in next((v.lower() for k, v in r.headers.items()
                                         if k.lower() == "access-control-request-headers"), "")]
    return seen + asked


def wait_for_ids(page, expected: list[str]) -> None:
    page.wait_for_function(
        "expected => JSON.stringify([...document.querySelectorAll('#jobs-body tr[data-key] td:first-child')]"
        ".map(td => td.textContent)) === JSON.stringify(expected)", arg=expected)


def talks_to_own_collector(page, collector) -> None:
    """Prove the page is still reading its own collector now: a new job there appears in the table."""
    submit(collector, "1002", "b200")
    wait_for_ids(page, ["1002", "1001", "1000"])
    assert page.is_hidden("#hint")


def open_with_token(page, collector) -> None:
    page.goto(collector.url + "/#token=r-ui")
    wait_for_ids(page, ["1001", "1000"])
    page.wait_for_selector("#connection[data-state=live]")


# ---------------------------------------------------------------- a link to another origin


def test_a_link_to_another_origin_asks_and_sends_it_nothing_meanwhile(collector, elsewhere, page):
    open_with_token(page, collector)
    page.goto(f"{collector.url}/#api={elsewhere.url}")
    page.wait_for_selector("#switch:not([hidden])")
    assert page.url == collector.url + "/"
    assert elsewhere.url in page.text_content("#switch-text")
    assert page.text_content("#switch-accept") == f"Switch to {elsewhere.url}"
    assert page.text_content("#switch-stay") == f"Stay on {collector.url}"
    talks_to_own_collector(page, collector)
    assert page.input_value("#api-base") == "" and page.input_value("#token") == "r-ui"
    assert authorized(elsewhere) == []
    assert elsewhere.requests == []  # nothing at all until the viewer answers
    page.click("#switch-stay")
    assert page.is_hidden("#switch")
    assert page.evaluate(STORAGE) == {f"collector.token:{collector.url}": "r-ui"}
    assert elsewhere.requests == []


def test_switching_sends_the_new_origin_only_its_own_token(collector, elsewhere, page):
    open_with_token(page, collector)
    page.goto(f"{collector.url}/#api={elsewhere.url}")
    page.click("#switch-accept")
    assert page.is_hidden("#switch")
    # No token kept for that origin: the page says it needs one.
    page.wait_for_selector(f"#hint:text('The collector at {elsewhere.url} needs a read token (401)')")
    wait_for(lambda: elsewhere.of("GET", "/api/events"), what="the page polling the other collector")
    assert page.input_value("#api-base") == elsewhere.url and page.input_value("#token") == ""
    assert elsewhere.of("GET", "/api/jobs")
    assert authorized(elsewhere) == []
    # The check can see a token: the one typed for this origin arrives, and only that one.
    page.fill("#token", "r-there")
    page.dispatch_event("#token", "change")
    wait_for_ids(page, ["2000"])
    assert {bearer(r) for r in elsewhere.requests} - {None} == {"Bearer r-there"}
    storage = page.evaluate(STORAGE)
    assert storage[f"collector.token:{collector.url}"] == "r-ui"
    assert storage[f"collector.token:{elsewhere.url}"] == "r-there"
    assert "collector.token" not in storage
    # Back home by the API field: the own token again.
    page.fill("#api-base", "")
    page.dispatch_event("#api-base", "change")
    wait_for_ids(page, ["1001", "1000"])
    assert page.input_value("#token") == "r-ui"


def test_a_links_token_is_discarded_when_the_viewer_stays(collector, elsewhere, page):
    open_with_token(page, collector)
    page.goto(f"{collector.url}/#token=X-link&api={elsewhere.url}")
    page.wait_for_selector("#switch:not([hidden])")
    assert "token" not in page.url and "X-link" not in page.url
    assert "kept for " + elsewhere.url in page.text_content("#switch-text")
    page.click("#switch-stay")
    assert page.is_hidden("#switch")
    storage = page.evaluate(STORAGE)
    assert not [key for key, value in storage.items() if "X-link" in value], storage
    assert storage[f"collector.token:{collector.url}"] == "r-ui"
    assert page.input_value("#token") == "r-ui" and page.input_value("#api-base") == ""
    # The original token still reads the page's collector.
    talks_to_own_collector(page, collector)
    assert elsewhere.requests == []


def test_a_links_token_is_kept_for_its_origin_when_the_viewer_switches(collector, elsewhere, page):
    open_with_token(page, collector)
    page.goto(f"{collector.url}/#token=r-there&api={elsewhere.url}")
    page.click("#switch-accept")
    wait_for_ids(page, ["2000"])
    assert page.input_value("#token") == "r-there"
    storage = page.evaluate(STORAGE)
    assert storage[f"collector.token:{collector.url}"] == "r-ui"
    assert storage[f"collector.token:{elsewhere.url}"] == "r-there"
    assert {bearer(r) for r in elsewhere.requests} - {None} == {"Bearer r-there"}


def test_a_link_naming_the_current_origin_switches_without_asking(collector, page):
    open_with_token(page, collector)
    page.goto(f"{collector.url}/#api={collector.url}/&token=r-ui")
    page.wait_for_function("document.getElementById('api-base').value !== ''")
    assert page.is_hidden("#switch")
    assert page.input_value("#api-base") == collector.url + "/"
    talks_to_own_collector(page, collector)


def test_typing_an_api_address_switches_at_once_and_shows_that_origins_token(collector, elsewhere, page):
    open_with_token(page, collector)
    page.fill("#api-base", elsewhere.url)
    page.dispatch_event("#api-base", "change")
    assert page.is_hidden("#switch")
    assert page.input_value("#token") == ""  # never the previous collector's
    page.wait_for_selector(f"#hint:text('The collector at {elsewhere.url} needs a read token (401)')")
    assert authorized(elsewhere) == []


def test_headers_carry_only_the_token_of_the_request_urls_origin(collector, elsewhere, page):
    open_with_token(page, collector)
    headers = page.evaluate("""([here, there]) => [
        C.headers(new URL('/api/jobs', here), { Accept: 'text/event-stream' }),
        C.headers(new URL('/api/jobs', there), { Accept: 'text/event-stream', authorization: 'Bearer smuggled' }),
    ]""", [collector.url, elsewhere.url])
    assert headers == [{"Accept": "text/event-stream", "Authorization": "Bearer r-ui"},
                       {"Accept": "text/event-stream"}]


# ---------------------------------------------------------------- the token kept before origins


def test_the_legacy_token_moves_to_the_pages_own_origin(collector, elsewhere, page):
    # The state the old page left: one token, and an API base that pointed elsewhere.
    page.goto(collector.url + "/")
    page.evaluate("""there => {
        localStorage.clear();
        localStorage.setItem('collector.token', 'r-ui');
        localStorage.setItem('collector.api', there);
    }""", elsewhere.url)
    page.reload()
    page.wait_for_selector(f"#hint:text('The collector at {elsewhere.url} needs a read token (401)')")
    storage = page.evaluate(STORAGE)
    assert "collector.token" not in storage
    assert storage[f"collector.token:{collector.url}"] == "r-ui"
    assert f"collector.token:{elsewhere.url}" not in storage
    assert elsewhere.requests and authorized(elsewhere) == []
    # Back to the page's own collector: the migrated token reads it.
    page.fill("#api-base", "")
    page.dispatch_event("#api-base", "change")
    assert page.input_value("#token") == "r-ui"
    wait_for_ids(page, ["1001", "1000"])


# ---------------------------------------------------------------- who wrote each event


def open_job(page, collector, job_id: str) -> None:
    open_with_token(page, collector)
    page.click(f"#jobs-body tr[data-key$='{job_id}']")
    page.wait_for_selector("table.timeline tbody tr >> nth=1")


def test_the_timeline_shows_the_credential_that_wrote_each_event(collector, page):
    # Written with the spec's write token: the collector names it env:write.
    put(collector, "1001", "workers", stage="workers", message="Starting workers", updated_at="2026-12-03T08:05:00Z",
        metadata={"cluster": "b200"})
    open_job(page, collector, "1001")
    rows = page.locator("table.timeline tbody tr")
    assert rows.locator(".by").all_inner_texts() == ["by env:write", "by env:write"]
    assert rows.nth(1).locator(".message").inner_text() == "Starting workers by env:write"


def test_the_credential_is_text_and_absent_when_unknown(collector, page):
    put(collector, "1001", "workers", stage="workers", message="Starting workers", updated_at="2026-12-03T08:05:00Z",
        metadata={"cluster": "b200"})

    def doctored(route):
        response = route.fetch()
        detail = response.json()
        detail["events"][0]["credential"] = None
        detail["events"][1]["credential"] = "<b>b200-writer</b>"
        route.fulfill(response=response, json=detail)

    page.route(re.compile(r"/api/jobs/1001(\?|$)"), doctored)
    open_job(page, collector, "1001")
    rows = page.locator("table.timeline tbody tr")
    assert rows.nth(0).locator(".by").count() == 0
    assert rows.nth(0).locator(".message").inner_text() == ""
    assert rows.nth(1).locator(".by").inner_text() == "by <b>b200-writer</b>"
    assert rows.nth(1).locator(".message b").count() == 0
