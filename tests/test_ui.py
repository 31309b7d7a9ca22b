"""The page, in a real browser (Debian's Chromium driven by Playwright) against a live collector.

Set COLLECTOR_UI_SCREENSHOTS=docs/img to (re)write the README's screenshots while the tests run.
"""

from __future__ import annotations

import datetime as dt
import http.client
import http.server
import os
import re
import socket
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from sqlalchemy import text

from collector import guard
from collector import ui
from collector.contract import format_timestamp
from tests.helpers import WAIT_MS
from tests.helpers import put
from tests.helpers import reported
from tests.helpers import wait_for

ROOT = Path(__file__).resolve().parents[1]
SCREENSHOTS = os.environ.get("COLLECTOR_UI_SCREENSHOTS")
FAST = {"stream_poll_s": 0.1, "stream_heartbeat_s": 5.0}
OCTET = {"Content-Type": "application/octet-stream"}
CLUSTERS = ("b200", "gb300")
# Three hours ago on the minute: recent enough for the screenshots to look like a working day.
START = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0) - dt.timedelta(hours=3)
LINE = 113  # bytes per line of the large log
# A cluster stream re-reads the clusters every second (collector/api/cluster_stream.py): a
# probe report is on the page a second or two later.
CLUSTER_LIVE_MS = 3_000
# One node of two drained: degraded, and still usable.
DRAINED = {"nodes": [{"name": "n1", "state": "drained", "reason": "disk"}, {"name": "n2", "state": "idle"}]}


# ---------------------------------------------------------------- the files, without a browser


@pytest.mark.parametrize("path", sorted(ui.FILES))
def test_page_files_are_open_typed_and_not_sniffed(api, path):
    response = requests.get(api.url + path, timeout=5)
    assert response.status_code == 200
    name, mimetype = ui.FILES[path]
    assert response.headers["Content-Type"] == f"{mimetype}; charset=utf-8"
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.headers["Content-Security-Policy"] == ui.POLICY
    assert response.content == (ROOT / "ui" / name).read_bytes()
    head = requests.head(api.url + path, timeout=5)
    assert head.status_code == 200 and head.content == b""


def test_every_file_the_page_loads_is_served_and_open():
    page = (ROOT / "ui" / "index.html").read_text()
    loaded = set(re.findall(r'(?:src|href)="([^"]+)"', page)) - {"data:,"}
    assert {"/" + name for name in loaded} == set(ui.FILES) - {"/", "/index.html"}
    assert set(ui.FILES) == guard.PAGE_PATHS
    assert {path.name for path in (ROOT / "ui").iterdir()} == {name for name, _ in ui.FILES.values()}


def test_page_loads_nothing_from_elsewhere_and_never_parses_html():
    for path in (ROOT / "ui").iterdir():
        text = path.read_text()
        assert not re.search(r"(?:src|href|url)\s*[=(]\s*[\"']?(?:https?:)?//", text), path.name
        assert "@import" not in text, path.name
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
            assert sink not in text, f"{path.name} uses {sink}"


@pytest.fixture
def collector(serve):
    """A collector with both tokens, streams polling fast (SQLite wakes its hub by polling)."""
    return serve(write_token="w-ui", read_token="r-ui", **FAST)


def at(minutes: float) -> str:
    """The time ``minutes`` after START, as the reporter writes it."""
    return (START + dt.timedelta(minutes=minutes)).isoformat().replace("+00:00", "Z")


def shown_at(minutes: float) -> str:
    """The same time as the page shows it (the browser runs in UTC)."""
    return (START + dt.timedelta(minutes=minutes)).strftime("%Y-%m-%d %H:%M:%S")


def seed(api, count=62):
    """``count`` jobs over two clusters, a minute apart; every fifth failed, every seventh still running."""
    for n in range(count):
        cluster = CLUSTERS[n % 2]
        job_id = str(1000 + n)
        body = {"job_id": job_id, "job_name": f"sweep-{n:02d}", "cluster": cluster, "recipe": f"recipes/r{n}.yaml",
                "submitted_at": at(n), "metadata": {"tags": [f"suite:s{n % 3}"]}}
        assert api.post("/api/jobs", json=body).status_code == 201
        if n % 5 == 0:
            put(api, job_id, "failed", stage="workers", message=f"Job failed with exit code {n}",
                updated_at=at(n + 60), exit_code=n, metadata={"cluster": cluster})
        elif n % 7 == 0:
            put(api, job_id, "benchmark", stage="benchmark", message="Running benchmark",
                updated_at=at(n + 60), started_at=at(n + 0.5), metadata={"cluster": cluster})


def open_page(page, server, query: str = "", token: str | None = "r-ui"):
    page.goto(server.url + "/" + query + (f"#token={token}" if token else ""))
    return page


def job_ids(page) -> list[str]:
    return page.locator("#jobs-body tr[data-key] td:first-child").all_inner_texts()


def wait_for_ids(page, expected: list[str]) -> None:
    page.wait_for_function(
        "expected => JSON.stringify([...document.querySelectorAll('#jobs-body tr[data-key] td:first-child')]"
        ".map(td => td.textContent)) === JSON.stringify(expected)", arg=expected)


def wait_for_status(page, job_id: str, shown: str) -> None:
    page.wait_for_function(
        "([id, shown]) => document.querySelector(`#jobs-body tr[data-key$='${id}'] .status`)?.textContent === shown",
        arg=[job_id, shown])


def chips(page) -> list[list[str | None]]:
    """Each cluster chip as [name, health, probe silent badge, detail] (null: not shown)."""
    return page.evaluate(CHIPS)


CHIPS = """() => [...document.querySelectorAll('#clusters .chip')].map(chip =>
    ['name', 'health', 'silent', 'detail'].map(part => chip.querySelector('.' + part)?.textContent ?? null))"""


def wait_for_chips(page, expected: list[list[str | None]], timeout: float = WAIT_MS) -> None:
    from playwright.sync_api import TimeoutError  # a page means Playwright is there

    try:
        page.wait_for_function(f"expected => JSON.stringify(({CHIPS})()) === JSON.stringify(expected)",
                               arg=expected, timeout=timeout)
    except TimeoutError:
        assert chips(page) == expected  # says what the page shows instead
        raise


def wait_for_cluster_stream(page) -> None:
    """The chips follow the cluster stream (the state line itself is hidden while live)."""
    page.wait_for_selector("#clusters-state[data-state=live]", state="attached")


def queue_badge(page, job_id: str) -> str | None:
    return page.evaluate("id => document.querySelector(`#jobs-body tr[data-key$='${id}'] .queue`)?.textContent ?? null",
                         job_id)


def shoot(page, name: str) -> None:
    if SCREENSHOTS:
        Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SCREENSHOTS) / name))


def upload_log(api, job_id, file, offset, data, cluster):
    response = api.post(f"/api/jobs/{job_id}/logs", params={"file": file, "offset": offset, "cluster": cluster},
                        data=data, headers=dict(OCTET))
    assert response.status_code == 200, response.text


# ---------------------------------------------------------------- the table


def test_table_pages_with_status_words_and_token_from_fragment(collector, page):
    seed(collector)
    # Started five seconds ago, so its elapsed time shows seconds.
    started = (dt.datetime.now(dt.UTC) - dt.timedelta(seconds=5)).isoformat().replace("+00:00", "Z")
    put(collector, "1056", "benchmark", stage="benchmark", message="Running benchmark", started_at=started,
        updated_at=at(116), metadata={"cluster": "b200"})
    reported(collector, "b200")
    reported(collector, "gb300", **DRAINED)
    open_page(page, collector)
    page.wait_for_selector("#jobs-body tr[data-key]")
    # #token= is stored and leaves the address at once.
    assert "token" not in page.url
    # Kept for the origin it was given for (tests/test_ui_token_origin.py has the rest).
    assert page.evaluate("origin => localStorage.getItem('collector.token:' + origin)", collector.url) == "r-ui"
    assert job_ids(page)[:3] == ["1061", "1060", "1059"]
    assert len(job_ids(page)) == 50
    assert page.text_content("#range") == "1–50 of 62 jobs · page 1 of 2"
    failed = page.locator("#jobs-body tr[data-key]", has_text="1060")
    assert failed.locator(".status").inner_text() == "✗ failed"  # a mark and a word, not colour alone
    assert failed.locator(".message").inner_text() == "Job failed with exit code 60"
    running = page.locator("#jobs-body tr[data-key]", has_text="1056")
    assert running.locator(".status").inner_text() == "● benchmark"
    # Elapsed time ticks for an active job.
    first = running.locator(".elapsed").inner_text()
    page.wait_for_function("first => document.querySelector(`tr[data-key$='1056'] .elapsed`).textContent !== first",
                           arg=first)
    shoot(page, "jobs.png")

    page.click("#next")
    wait_for_ids(page, [str(n) for n in range(1011, 999, -1)])
    assert page.text_content("#range") == "51–62 of 62 jobs · page 2 of 2"
    assert "page=2" in page.url and page.is_disabled("#next")
    # The page lives in the URL: a reload (now without the fragment) shows the same page.
    page.reload()
    wait_for_ids(page, [str(n) for n in range(1011, 999, -1)])


def test_filters_search_and_sort_are_server_side_and_in_the_url(collector, page):
    seed(collector)
    open_page(page, collector)
    page.wait_for_selector("#jobs-body tr[data-key]")
    # The cluster filter lists the clusters with their counts (GET /api/clusters), which
    # may answer after the first page of jobs has been drawn.
    options = ["all clusters", "b200 (31)", "gb300 (31)"]
    try:
        page.wait_for_function("expected => JSON.stringify([...document.querySelectorAll('#cluster option')]"
                               ".map(o => o.textContent)) === JSON.stringify(expected)", arg=options,
                               timeout=WAIT_MS)
    finally:
        assert page.locator("#cluster option").all_inner_texts() == options  # says what the page shows instead
    page.select_option("#status", "failed")
    wait_for_ids(page, ["1060", "1055", "1050", "1045", "1040", "1035", "1030", "1025", "1020", "1015", "1010",
                        "1005", "1000"])
    page.select_option("#cluster", "gb300")
    wait_for_ids(page, ["1055", "1045", "1035", "1025", "1015", "1005"])
    assert page.text_content("#range") == "1–6 of 6 jobs · page 1 of 1"
    assert page.locator("#status option:checked").inner_text() == "✗ failed (6)"
    page.fill("#q", "SUITE:S1")  # a tag, any case
    wait_for_ids(page, ["1055", "1025"])
    assert "q=SUITE%3AS1" in page.url and "status=failed" in page.url and "cluster=gb300" in page.url
    page.fill("#q", "")
    page.select_option("#status", "")
    page.select_option("#cluster", "")
    page.fill("#q", "sweep-0")
    wait_for_ids(page, [str(n) for n in range(1009, 999, -1)])
    page.click("th[data-sort=job_id] button")
    wait_for_ids(page, [str(n) for n in range(1000, 1010)])
    assert "sort=job_id" in page.url
    assert page.get_attribute("th[data-sort=job_id]", "aria-sort") == "ascending"
    page.click("th[data-sort=job_id] button")
    wait_for_ids(page, [str(n) for n in range(1009, 999, -1)])
    assert "order=desc" in page.url
    page.select_option("#sort", "status")
    wait_for_ids(page, ["1009", "1008", "1006", "1004", "1003", "1002", "1001", "1007", "1005", "1000"])
    # A shared link opens the same view.
    link = page.url
    page.goto("about:blank")
    page.goto(link)
    wait_for_ids(page, ["1009", "1008", "1006", "1004", "1003", "1002", "1001", "1007", "1005", "1000"])
    assert page.input_value("#q") == "sweep-0" and page.input_value("#sort") == "status"


def test_job_text_is_shown_as_text_never_as_html(collector, page):
    name = '<img src=x onerror="window.injected=1">'
    collector.post("/api/jobs", json={"job_id": "x1", "job_name": name, "cluster": "b200",
                                      "submitted_at": "2025-01-26T10:00:00Z", "metadata": {"note": "<b>bold</b>"}})
    put(collector, "x1", "failed", message="<script>window.injected=2</script>", metadata={"cluster": "b200"})
    open_page(page, collector)
    page.wait_for_selector("#jobs-body tr[data-key]")
    assert page.locator("#jobs-body td.name").inner_text() == name
    assert page.locator("#jobs-body td.message").inner_text() == "<script>window.injected=2</script>"
    page.click("#jobs-body tr[data-key]")
    page.wait_for_selector("details.raw pre")
    assert '"note": "<b>bold</b>"' in page.locator("details.raw pre").first.inner_text()
    assert page.locator("#detail img, #detail b, #jobs-body img").count() == 0
    assert page.evaluate("window.injected") is None


# ---------------------------------------------------------------- the detail pane


def lifecycle(api, job_id, cluster):
    api.post("/api/jobs", json={"job_id": job_id, "job_name": "kv-router-sweep", "cluster": cluster,
                                "recipe": "recipes/kv.yaml", "submitted_at": at(70),
                                "metadata": {"tags": ["suite:kv"]}})
    put(api, job_id, "starting", stage="starting", message="Job started on node-01",
        updated_at=at(73), started_at=at(73),
        metadata={"cluster": cluster, "head_node": "node-01", "log_dir": "/lustre/logs/9001",
                  "model": {"path": "/models/deepseek-r1", "precision": "fp8"},
                  "resources": {"gpu_type": "b200", "gpus_per_node": 8}})
    put(api, job_id, "workers", stage="workers", message="Starting workers", updated_at=at(75.5),
        metadata={"cluster": cluster})
    put(api, job_id, "completed", stage="cleanup", message="Benchmark completed successfully", exit_code=0,
        logs_url="s3://bucket/outputs/9001/", updated_at=at(102), completed_at=at(102),
        benchmark_results={"throughput": 1234.5},
        metadata={"cluster": cluster})


def test_detail_pane_overview_timeline_and_raw_metadata(collector, page):
    seed(collector, 4)
    lifecycle(collector, "9001", "gb300")
    open_page(page, collector)
    page.click("#jobs-body tr[data-key$='9001']")
    page.wait_for_selector("table.timeline tbody tr")
    assert "job=9001" in page.url and "job_cluster=gb300" in page.url
    assert page.get_attribute("#jobs-body tr[data-key$='9001']", "aria-selected") == "true"
    overview = dict(zip(page.locator("dl.overview dt").all_inner_texts(),
                        page.locator("dl.overview dd").all_inner_texts(), strict=True))
    assert overview["cluster"] == "gb300"
    assert overview["exit code"] == "0"
    assert overview["duration"] == "29m 00s"
    assert overview["model"] == "path: /models/deepseek-r1 · precision: fp8"
    assert overview["resources"] == "gpu_type: b200 · gpus_per_node: 8"
    assert overview["head node"] == "node-01"
    assert overview["recipe"] == "recipes/kv.yaml"
    assert overview["log dir"] == "/lustre/logs/9001"
    assert overview["logs URL"] == "s3://bucket/outputs/9001/"
    assert overview["tags"] == "suite:kv"
    # Who wrote each event (".by") has its own test in tests/test_ui_token_origin.py.
    timeline = page.evaluate("""() => [...document.querySelectorAll('table.timeline tbody tr')].map(tr =>
        [...tr.cells].map(td => [...td.childNodes].filter(n => !n.classList?.contains('by'))
            .map(n => n.textContent).join('').trim()))""")
    assert timeline == [
        [shown_at(70), "", "○ submitted", "", ""],
        [shown_at(73), "+3m 00s", "◔ starting", "starting", "Job started on node-01"],
        [shown_at(75.5), "+2m 30s", "◑ workers", "workers", "Starting workers"],
        [shown_at(102), "+26m 30s", "✓ completed", "cleanup", "Benchmark completed successfully"],
    ]
    raw = page.locator("details.raw pre").all_text_contents()  # closed ones too
    assert '"head_node": "node-01"' in raw[0]
    assert raw[1] == "null" and '"throughput": 1234.5' in raw[2]
    shoot(page, "detail.png")
    # The selected job is in the URL: a reload opens it again.
    page.reload()
    page.wait_for_selector("table.timeline tbody tr >> nth=3")


def test_arrow_keys_move_between_jobs(collector, page):
    seed(collector, 5)
    open_page(page, collector)
    page.wait_for_selector("#jobs-body tr[data-key]")
    page.keyboard.press("ArrowDown")
    page.wait_for_selector("#detail .job-title:text-is('1004')")
    page.keyboard.press("ArrowDown")
    page.keyboard.press("ArrowDown")
    page.wait_for_selector("#detail .job-title:text-is('1002')")
    assert page.get_attribute("#jobs-body tr[data-key$='1002']", "aria-selected") == "true"
    assert "job=1002" in page.url
    page.keyboard.press("ArrowUp")
    page.wait_for_selector("#detail .job-title:text-is('1003')")
    # Typing in the search box is not navigation.
    page.click("#q")
    page.keyboard.press("ArrowDown")
    page.wait_for_timeout(300)
    assert page.text_content("#detail .job-title") == "1003"


# ---------------------------------------------------------------- live


def test_a_put_appears_live_without_reload(collector, page):
    seed(collector, 3)
    open_page(page, collector)
    page.wait_for_selector("#connection[data-state=live]")
    assert page.text_content("#connection") == "live: event stream"
    put(collector, "1001", "frontend", stage="frontend", message="Inference endpoint ready",
        updated_at=at(120), metadata={"cluster": "gb300"})
    row = page.locator("#jobs-body tr[data-key$='1001']")
    wait_for_status(page, "1001", "◕ frontend")
    assert row.locator(".message").inner_text() == "Inference endpoint ready"
    feed = page.locator("#feed li").first
    assert feed.inner_text() == f"{shown_at(120)} 1001 gb300 ◕ frontend frontend Inference endpoint ready"
    # A new job lands in the table too (a throttled re-read of the page).
    collector.post("/api/jobs", json={"job_id": "2000", "job_name": "late", "cluster": "b200",
                                      "submitted_at": at(121)})
    wait_for_ids(page, ["2000", "1002", "1001", "1000"])
    # Clicking a job id in the feed opens that job.
    page.click("#feed li >> nth=1 >> button.job-id")
    page.wait_for_selector("#detail .job-title:text-is('1001')")
    page.wait_for_selector("table.timeline tbody tr >> nth=1")
    # With the job open, its next event reaches the timeline.
    put(collector, "1001", "benchmark", stage="benchmark", message="Running benchmark",
        updated_at=at(125), metadata={"cluster": "gb300"})
    page.wait_for_selector("table.timeline tbody tr:has-text('Running benchmark')")
    assert page.locator("table.timeline tbody tr").last.locator(".delta").inner_text() == "+5m 00s"


def test_polling_takes_over_when_the_stream_is_refused(serve, page):
    server = serve(write_token="w-ui", read_token="r-ui", max_streams=0, **FAST)
    seed(server, 2)
    open_page(page, server)
    page.select_option("#interval", "2000")
    page.wait_for_selector("#connection[data-state=polling]")
    assert page.text_content("#connection").startswith("polling every 2 s (stream unavailable: 503 ")
    put(server, "1000", "workers", stage="workers", message="Starting workers", updated_at=at(120),
        metadata={"cluster": "b200"})
    page.wait_for_function("() => document.querySelector('#feed li').textContent.endsWith("
                           "'1000 b200 ◑ workers workers Starting workers')")
    wait_for_status(page, "1000", "◑ workers")
    # The cluster health polls too.
    page.wait_for_selector("#clusters-state[data-state=polling]")
    assert [chip[0] for chip in chips(page)] == ["b200", "gb300"]
    page.select_option("#interval", "0")
    page.wait_for_selector("#connection[data-state=paused]")


# ---------------------------------------------------------------- cluster health


def test_cluster_chips_show_health_and_detail_change_live_and_filter(collector, page):
    seed(collector, 4)
    collector.post("/api/jobs", json={"job_id": "3000", "job_name": "a100-run", "cluster": "a100",
                                      "submitted_at": at(10)})
    reported(collector, "b200")
    reported(collector, "gb300", **DRAINED)
    open_page(page, collector)
    # One chip per cluster with a job or a probe; the detail is on the chip, not only in its tooltip.
    wait_for_chips(page, [["a100", "no probe", None, None], ["b200", "available", None, None],
                          ["gb300", "degraded", None, "n1 drained (disk)"]])
    assert page.get_attribute("#clusters .chip[data-cluster=gb300]", "data-health") == "degraded"
    assert page.is_visible("#clusters .chip[data-cluster=gb300] .detail")
    wait_for_cluster_stream(page)
    # A probe report reaches the chip without a reload.
    reported(collector, "b200", error="slurm_load_partitions: Unable to contact slurm controller", nodes=[])
    reported(collector, "gb300")
    wait_for_chips(page, [["a100", "no probe", None, None],
                          ["b200", "unavailable", None, "slurm_load_partitions: Unable to contact slurm controller"],
                          ["gb300", "available", None, None]], timeout=CLUSTER_LIVE_MS)
    # A chip is the cluster filter; a second click clears it.
    page.click("#clusters .chip[data-cluster=gb300]")
    wait_for_ids(page, ["1003", "1001"])
    assert page.input_value("#cluster") == "gb300" and "cluster=gb300" in page.url
    assert page.get_attribute("#clusters .chip[data-cluster=gb300]", "aria-pressed") == "true"
    page.click("#clusters .chip[data-cluster=gb300]")
    wait_for_ids(page, ["3000", "1003", "1002", "1001", "1000"])
    assert page.input_value("#cluster") == ""


def test_a_silent_probe_is_shown_as_such_live(collector, database, page):
    seed(collector, 2)
    reported(collector, "b200", interval_s=30)
    open_page(page, collector)
    wait_for_chips(page, [["b200", "available", None, None], ["gb300", "no probe", None, None]])
    last = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(minutes=10)
    with database.engine.begin() as conn:  # ten minutes without a report
        conn.execute(text("UPDATE cluster_probes SET received_at = :t"),
                     {"t": last if database.is_postgres else last.replace(tzinfo=None)})
    detail = f"probe silent since {format_timestamp(last)} (expected every 30 s); last report: available"
    wait_for_chips(page, [["b200", "unavailable", "probe silent", detail], ["gb300", "no probe", None, None]],
                   timeout=CLUSTER_LIVE_MS)


def test_a_queued_job_shows_its_reason_in_the_table_and_the_detail_pane(collector, page):
    seed(collector, 3)  # 1002 on b200 is submitted, not started
    pending = {"job_id": "1002", "state": "PENDING", "reason": "Resources"}
    reported(collector, "b200", jobs=[pending], queried_job_ids=["1002"])
    open_page(page, collector, "?job=1002&job_cluster=b200")
    page.wait_for_selector("#jobs-body tr[data-key$='1002'] .queue")
    assert queue_badge(page, "1002") == "queued: Resources"
    assert queue_badge(page, "1001") is None
    slurm = page.locator("#detail dd[data-field=slurm]")
    assert slurm.inner_text() == f"PENDING (Resources) since {shown_at(2)}"
    # Slurm's reason changes, then the job starts: both reach the table and the open detail live.
    reported(collector, "b200", jobs=[{**pending, "reason": "Priority"}], queried_job_ids=["1002"])
    page.wait_for_function("() => document.querySelector(`tr[data-key$='1002'] .queue`)?.textContent"
                           " === 'queued: Priority'", timeout=CLUSTER_LIVE_MS)
    page.wait_for_selector(f"#detail dd[data-field=slurm]:text-is('PENDING (Priority) since {shown_at(2)}')",
                           timeout=CLUSTER_LIVE_MS)
    reported(collector, "b200", jobs=[{"job_id": "1002", "state": "RUNNING"}], queried_job_ids=["1002"])
    page.wait_for_selector("#detail dd[data-field=slurm]:text-matches('^RUNNING since ')", timeout=CLUSTER_LIVE_MS)
    assert queue_badge(page, "1002") is None
    assert page.locator("#jobs-body tr[data-key$='1002'] .status").inner_text() == "○ submitted"


# ---------------------------------------------------------------- logs and captures


def test_logs_tab_tails_a_growing_file_strips_ansi_filters_and_downloads(collector, page):
    seed(collector, 1)
    upload_log(collector, "1000", "worker.out", 0, b"\x1b[32mINFO\x1b[0m loading model\nstep 1\n", "b200")
    upload_log(collector, "1000", "sub/other.err", 0, b"x", "b200")
    open_page(page, collector)
    page.select_option("#interval", "2000")
    page.click("#jobs-body tr[data-key$='1000']")
    page.click("#detail [role=tab][data-tab=logs]")
    # The file list arrives after the tab opens: wait for it, then read it whole.
    page.wait_for_selector("ul.files button[data-file='worker.out']")
    assert page.locator("ul.files button").all_inner_texts() == ["sub/other.err 1 B", "worker.out 35 B"]
    page.click("ul.files button[data-file='worker.out']")
    page.wait_for_selector("pre.log:text('step 1')")
    assert page.inner_text("pre.log") == "INFO loading model\nstep 1"
    assert "file=worker.out" in page.url and "tab=logs" in page.url
    # New bytes arrive on the poll interval; a line split across uploads reads whole.
    upload_log(collector, "1000", "worker.out", 35, b"step 2 \x1b[1;31mERR", "b200")
    upload_log(collector, "1000", "worker.out", 52, b"OR\x1b[0m\nstep 3\n", "b200")
    page.wait_for_selector("pre.log:text('step 3')")
    assert page.inner_text("pre.log") == "INFO loading model\nstep 1\nstep 2 ERROR\nstep 3"
    page.fill(".log-bar input[type=search]", "STEP")
    page.wait_for_function("() => document.querySelector('pre.log').textContent === 'step 1\\nstep 2 ERROR\\nstep 3'")
    shoot(page, "logs.png")
    with page.expect_download() as download:
        page.click(".log-bar button.download")
    assert download.value.suggested_filename == "worker.out"
    # The whole file as stored, colour codes and all.
    assert Path(download.value.path()).read_bytes() == (
        b"\x1b[32mINFO\x1b[0m loading model\nstep 1\nstep 2 \x1b[1;31mERROR\x1b[0m\nstep 3\n")


def test_a_large_log_opens_at_its_tail_and_from_start_reads_it_all(collector, page):
    seed(collector, 1)
    lines = b"".join(b"line %06d %s\n" % (n, b"x" * 100) for n in range(25_000))  # about 2.8 MB
    for start in range(0, len(lines), 1024 * 1024):
        upload_log(collector, "1000", "big.log", start, lines[start:start + 1024 * 1024], "b200")
    open_page(page, collector, "?job=1000&job_cluster=b200&tab=logs&file=big.log")
    page.wait_for_selector("pre.log:text('line 024999')")
    shown = page.inner_text("pre.log").split("\n")
    # The last 256 KiB, without the partial line it starts in.
    assert shown[-1].startswith("line 024999 ")
    assert len(shown) == 256 * 1024 // LINE and shown[0].startswith(f"line {25_000 - len(shown):06d} ")
    assert "from byte 2,562,856 (the last 256 KiB" in page.text_content(".log-status")
    page.click(".log-bar button.from-start")
    page.wait_for_function("() => document.querySelector('.log-status').textContent.includes('newest 20,000 lines')")
    page.wait_for_selector("pre.log:text('line 024999')")
    shown = page.inner_text("pre.log").split("\n")
    assert len(shown) == 20_000 and shown[0].startswith("line 005000 ")


def test_tachometer_tab_lists_segments_and_downloads_complete_ones(collector, page):
    seed(collector, 1)
    segment = bytes(range(256)) * 40
    for offset in (0, 8192):
        response = collector.post("/api/jobs/1000/captures", headers=dict(OCTET), data=segment[offset:offset + 8192],
                                  params={"file": "out-1.parquet", "offset": offset, "total": len(segment),
                                          "cluster": "b200"})
        assert response.status_code == 200, response.text
    collector.post("/api/jobs/1000/captures", headers=dict(OCTET), data=b"PAR1",
                   params={"file": "out-2.parquet", "offset": 0, "total": 100, "cluster": "b200"})
    open_page(page, collector, "?job=1000&job_cluster=b200&tab=tachometer")
    page.wait_for_selector("table.captures tbody tr >> nth=1")
    rows = [row.split("\t") for row in page.locator("table.captures tbody tr").all_inner_texts()]
    assert rows == [["out-1.parquet", "10 KiB", "✓ complete", "download"],
                    ["out-2.parquet", "4 B", "… partial", "uploading…"]]
    with page.expect_download() as download:
        page.click("table.captures button.download")
    assert download.value.suggested_filename == "out-1.parquet"
    assert Path(download.value.path()).read_bytes() == segment


# ---------------------------------------------------------------- tokens, API base, hints


def test_missing_and_wrong_tokens_are_explained(collector, page):
    seed(collector, 1)
    open_page(page, collector, token=None)
    page.wait_for_selector("#hint:not([hidden])")
    assert page.text_content("#hint") == (f"The collector at {collector.url} needs a read token (401). Paste it in the "
                                          "token field, or open the page with #token=<read token>.")
    page.fill("#token", "wrong")
    page.dispatch_event("#token", "change")
    page.wait_for_selector("#hint:text('refused the read token')")
    assert page.text_content("#hint") == (f"The collector at {collector.url} refused the read token (401: invalid "
                                          "bearer token). Paste a valid read token in the token field.")
    page.fill("#token", "r-ui")
    page.dispatch_event("#token", "change")
    page.wait_for_selector("#jobs-body tr[data-key]")
    assert page.is_hidden("#hint")
    assert page.evaluate("origin => localStorage.getItem('collector.token:' + origin)", collector.url) == "r-ui"


def test_api_fragment_points_the_page_at_another_collector(serve, page):
    here = serve()  # serves the page only
    there = serve(write_token="w-ui", read_token="r-ui", cors_origins=(here.url,), **FAST)
    seed(there, 2)
    page.goto(f"{here.url}/#api={there.url}&token=r-ui")
    page.click("#switch-accept")  # another origin: the page asks first
    wait_for_ids(page, ["1001", "1000"])
    assert page.url == here.url + "/"
    assert page.evaluate("localStorage.getItem('collector.api')") == there.url
    assert page.evaluate("origin => localStorage.getItem('collector.token:' + origin)", there.url) == "r-ui"
    assert page.input_value("#api-base") == there.url
    page.wait_for_selector("#connection[data-state=live]")
    # Remembered: a plain reload still reads the other collector.
    page.reload()
    wait_for_ids(page, ["1001", "1000"])


def test_cors_refusal_names_the_origin_to_allow(serve, page):
    here = serve()
    there = serve(write_token="w-ui", read_token="r-ui")  # no --cors-origin
    page.goto(f"{here.url}/#api={there.url}&token=r-ui")
    page.click("#switch-accept")
    page.wait_for_selector("#hint:not([hidden])")
    assert page.text_content("#hint") == (
        f"The collector at {there.url} answered but does not allow this page's origin: start it with "
        f"--cors-origin {here.url} (or set COLLECTOR_CORS_ORIGINS).")


def test_unreachable_collector_is_explained(serve, page):
    here = serve()
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{sock.getsockname()[1]}"
    page.goto(f"{here.url}/#api={nowhere}")
    page.click("#switch-accept")
    page.wait_for_selector("#hint:not([hidden])")
    assert page.text_content("#hint") == (f"Cannot reach the collector at {nowhere} (network error). "
                                          "Is it running, and is the API field right?")


def test_page_opened_from_a_file_reads_a_collector_allowing_any_origin(serve, page):
    there = serve(write_token="w-ui", read_token="r-ui", cors_origins=("*",), **FAST)
    seed(there, 2)
    index = (ROOT / "ui" / "index.html").as_uri()
    page.goto(index)
    page.wait_for_selector("#hint:not([hidden])")
    assert page.text_content("#hint").startswith("This page was opened from a file: set the collector's address")
    # Only the fragment changes, so the page does not reload: it applies them on hashchange.
    page.goto(f"{index}#api={there.url}&token=r-ui")
    page.click("#switch-accept")  # a link to a collector: asked even here
    wait_for_ids(page, ["1001", "1000"])
    assert page.url == index
    page.wait_for_selector("#connection[data-state=live]")


# ---------------------------------------------------------------- /status/ behind a proxy


class _StatusProxy(http.server.ThreadingHTTPServer):
    """The documented zero-setup mode in miniature: ui/ under /status/, /status/api/* to the collector, token added."""

    daemon_threads = True

    def __init__(self, upstream: str, token: str) -> None:
        self.upstream = urllib.parse.urlsplit(upstream)
        self.token = token
        super().__init__(("127.0.0.1", 0), _StatusHandler)


class _StatusHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        path = self.path
        if path.startswith("/status/api/"):
            return self.forward(path[len("/status"):])
        name = urllib.parse.urlsplit(path).path.removeprefix("/status/") or "index.html"
        file = ROOT / "ui" / name
        if not path.startswith("/status/") or not file.is_file():
            self.send_error(404)
            return
        body = file.read_bytes()
        self.send_response(200)
        self.send_header("Content-Type", {"js": "text/javascript", "css": "text/css"}.get(file.suffix[1:], "text/html"))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def forward(self, path: str) -> None:
        server = self.server
        assert isinstance(server, _StatusProxy)
        upstream = server.upstream
        conn = http.client.HTTPConnection(upstream.hostname or "127.0.0.1", upstream.port, timeout=30)
        # The proxy's token replaces whatever the browser sent.
        conn.request("GET", path, headers={"Authorization": f"Bearer {server.token}",
                                           "Accept": self.headers.get("Accept", "*/*")})
        response = conn.getresponse()
        self.send_response(response.status)
        for name, value in response.getheaders():
            if name.lower() not in ("connection", "transfer-encoding", "content-length", "keep-alive"):
                self.send_header(name, value)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            while chunk := response.read1(65536):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            conn.close()


@pytest.fixture
def status_proxy(collector) -> Iterator[str]:
    proxy = _StatusProxy(collector.url, "r-ui")
    thread = threading.Thread(target=proxy.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{proxy.server_port}"
    proxy.shutdown()
    proxy.server_close()


def test_status_prefix_mode_needs_no_token_in_the_browser(collector, status_proxy, page):
    seed(collector, 2)
    page.goto(status_proxy + "/status/")
    wait_for_ids(page, ["1001", "1000"])
    page.wait_for_selector("#connection[data-state=live]")
    assert page.evaluate("Object.keys(localStorage).filter(key => key.startsWith('collector.token'))") == []
    put(collector, "1000", "workers", stage="workers", message="Starting workers", updated_at=at(120),
        metadata={"cluster": "b200"})
    wait_for_status(page, "1000", "◑ workers")
    # The cluster stream comes through the proxy as well.
    wait_for_cluster_stream(page)
    reported(collector, "b200", **DRAINED)
    wait_for_chips(page, [["b200", "degraded", None, "n1 drained (disk)"], ["gb300", "no probe", None, None]],
                   timeout=CLUSTER_LIVE_MS)


# ---------------------------------------------------------------- the SSE parser and the ANSI stripper, as units


def page_scripts() -> list[str]:
    """The page's scripts, in the order index.html loads them."""
    return re.findall(r'<script src="([^"]+)"', (ROOT / "ui" / "index.html").read_text())


@pytest.fixture(scope="module")
def scripts(browser):
    """A blank page with the page's scripts loaded in order (none starts the page: that waits
    for DOMContentLoaded, long past); an uncaught script error fails the module."""
    context = browser.new_context()
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda error: errors.append(str(error)))
    tab.goto("about:blank")
    for name in page_scripts():
        tab.add_script_tag(path=str(ROOT / "ui" / name))
    yield tab
    context.close()
    assert errors == []


def test_the_scripts_share_one_namespace_and_keep_state_in_one_object(page):
    names = page_scripts()
    assert names[0] == "util.js" and names[-1] == "app.js"
    page.goto("about:blank")
    before = set(page.evaluate("Object.keys(window)"))
    for name in names:
        page.add_script_tag(path=str(ROOT / "ui" / name))
    assert set(page.evaluate("Object.keys(window)")) - before == {"C"}
    assert page.evaluate("typeof C.el === 'function' && typeof C.state.route === 'object'")


def event(data: str, type: str = "message", id: str | None = None) -> dict:
    return {"type": type, "data": data, "id": id}


# Each case: the stream's text, as chunks, and the events it holds, exactly.
SSE_CASES = {
    "one event": (["data: hello\n\n"], [event("hello")]),
    "no space after the colon": (["data:hello\n\n"], [event("hello")]),
    "only one leading space is dropped": (["data:  two\n\n"], [event(" two")]),
    "colons in the value stay": (["data: a:b: c\n\n"], [event("a:b: c")]),
    "data lines join with \\n": (["data: one\ndata: two\ndata:\n\n"], [event("one\ntwo\n")]),
    "a field without a colon has an empty value": (["data\n\nevent\ndata: x\n\n"], [event(""), event("x")]),
    "event and id fields": (["event: job-event\nid: 42\ndata: {}\n\n"], [event("{}", "job-event", "42")]),
    # Unlike EventSource's last event id, this parser's id is the event's own: the streams'
    # cursors travel in the data.
    "type and id are reset after each event": (["event: a\nid: 1\ndata: x\n\ndata: y\n\n"],
                                              [event("x", "a", "1"), event("y")]),
    "comments, retry and unknown fields are ignored": ([": heartbeat\nretry: 1000\nfoo: bar\ndata: x\n:\n: more\n\n"],
                                                       [event("x")]),
    "a comment inside an event does not end it": (["data: a\n: ping\ndata: b\n\n"], [event("a\nb")]),
    "a heartbeat alone dispatches nothing": ([": heartbeat\n\n", ":\n\n"], []),
    "an event without data dispatches nothing, and its type does not leak": (["event: ping\nid: 9\n\n", "data: z\n\n"],
                                                                             [event("z")]),
    "\\r\\n line ends": (["event: a\r\ndata: x\r\ndata: y\r\n\r\n"], [event("x\ny", "a")]),
    "bare \\r line ends": (["data: x\rdata: y\r\rdata: z\r\n\r\n"], [event("x\ny"), event("z")]),
    "mixed line ends": (["data: a\r\ndata: b\ndata: c\r\rdata: d\n\n"], [event("a\nb\nc"), event("d")]),
    "\\r\\n split between chunks is one line end": (["data: x\r", "\ndata: y\r", "\n\r", "\n"], [event("x\ny")]),
    # A \r at the end of what arrived may be half of \r\n: the line waits for the next chunk.
    "a final \\r waits for the next chunk": (["data: x\r\r"], []),
    "a frame split mid-field and mid-line": (["ev", "ent: job-", "event\nda", 'ta: {"id"', ": 7}\n", "\n"],
                                             [event('{"id": 7}', "job-event")]),
    "several frames in one chunk": (["data: 1\n\ndata: 2\n\nevent: e\ndata: 3\n\n"],
                                    [event("1"), event("2"), event("3", "e")]),
    "an unfinished frame is held back": (["data: 1\n\ndata: 2\n"], [event("1")]),
    "text beyond ASCII": (["data: ✓ naïve 🚀 漢字\n\n"], [event("✓ naïve 🚀 漢字")]),
    "JSON with escaped newlines stays one line": (['data: {"message": "a\\nb"}\n\n'], [event('{"message": "a\\nb"}')]),
}

# Feeds ``chunks`` to a new C.SSEParser, then the same text whole, one UTF-16 unit at a time
# and cut in two at every place: one result per way.
PARSE_EVERY_WAY = """chunks => {
    const parse = (parts) => {
        const events = [];
        const parser = new C.SSEParser((event) => events.push(event));
        for (const part of parts) parser.feed(part);
        return events;
    };
    const text = chunks.join("");
    const ways = { "as sent": parse(chunks), whole: parse([text]), "one unit at a time": parse(text.split("")) };
    for (let i = 1; i < text.length; i++) ways[`cut at ${i}`] = parse([text.slice(0, i), text.slice(i)]);
    return ways;
}"""


@pytest.mark.parametrize("case", SSE_CASES)
def test_sse_parser(scripts, case):
    chunks, expected = SSE_CASES[case]
    ways = scripts.evaluate(PARSE_EVERY_WAY, chunks)
    assert ways["as sent"] == expected
    assert {way: events for way, events in ways.items() if events != expected} == {}


# C.readEvents over a body of byte chunks, as fetch hands it over: decoding, then parsing.
READ_BYTES = """async chunks => {
    const events = [];
    const body = new ReadableStream({
        start(controller) {
            for (const chunk of chunks) controller.enqueue(new Uint8Array(chunk));
            controller.close();
        },
    });
    await C.readEvents(body, (event) => events.push(event));
    return events;
}"""


def byte_chunks(data: bytes, *cuts: int) -> list[list[int]]:
    edges = [0, *cuts, len(data)]
    return [list(data[a:b]) for a, b in zip(edges, edges[1:], strict=False)]


def test_sse_reader_decodes_utf8_split_anywhere(scripts):
    text = "data: ✓ é 🚀 漢\r\n\r\n"
    data = text.encode()
    expected = [event("✓ é 🚀 漢")]
    for cut in range(1, len(data)):  # inside every multibyte character too
        assert scripts.evaluate(READ_BYTES, byte_chunks(data, cut)) == expected, cut
    assert scripts.evaluate(READ_BYTES, byte_chunks(data, *range(1, len(data)))) == expected


def test_sse_reader_drops_a_bom_and_replaces_bad_bytes(scripts):
    data = b"\xef\xbb\xbfdata: a\xffb\n\n"
    assert scripts.evaluate(READ_BYTES, byte_chunks(data, 1, 2)) == [event("a\ufffdb")]


def test_sse_reader_ends_quietly_on_a_broken_body(scripts):
    # One event, then half of another, then the connection breaks: readEvents resolves (the
    # caller reconnects) with the whole event delivered and the half dropped.
    events = scripts.evaluate("""async () => {
        const events = [];
        let delivered;
        const first = new Promise((resolve) => (delivered = resolve));
        let pulls = 0;
        const body = new ReadableStream({
            async pull(controller) {
                if (pulls++ === 0) {
                    controller.enqueue(new TextEncoder().encode("id: 1\\ndata: whole\\n\\ndata: half"));
                    return;
                }
                await first;
                controller.error(new TypeError("network error"));
            },
        });
        await C.readEvents(body, (event) => { events.push(event); delivered(); });
        return events;
    }""")
    assert events == [event("whole", id="1")]


ESC = "\x1b"
# Each case: a log's text and what C.stripAnsi leaves of it, exactly.
ANSI_CASES = {
    "plain text": ("plain text", "plain text"),
    "empty": ("", ""),
    "colours": (f"{ESC}[32mINFO{ESC}[0m loading", "INFO loading"),
    "bold red, reset without a number": (f"{ESC}[1;31mERROR{ESC}[m done", "ERROR done"),
    "256 and 24-bit colours": (f"{ESC}[38;5;196mred{ESC}[38;2;255;128;0morange{ESC}[39m", "redorange"),
    "cursor moves and erases": (f"{ESC}[2K{ESC}[1Gstep 3/10{ESC}[3A{ESC}[10;20H{ESC}[J", "step 3/10"),
    "private modes": (f"{ESC}[?25lhidden{ESC}[?25h {ESC}[?2004h", "hidden "),
    "an intermediate byte": (f"{ESC}[2 qblock", "block"),
    "an OSC title ended by BEL": (f"{ESC}]0;user@host: ~\x07text", "text"),
    "an OSC hyperlink ended by ST": (f"{ESC}]8;;http://example.test/x{ESC}\\link{ESC}]8;;{ESC}\\ after",
                                     "link after"),
    "two-byte escapes": (f"a{ESC}Mb{ESC}Dc{ESC}Ed{ESC}\\e", "abcde"),
    "control characters other than ESC stay": ("10%\r50%\r100%\t\x07\n", "10%\r50%\r100%\t\x07\n"),
    "text beyond ASCII": (f"✓ naïve 🚀 {ESC}[1m漢字{ESC}[0m", "✓ naïve 🚀 漢字"),
    "several in a row": (f"{ESC}[0m{ESC}[1m{ESC}[4m{ESC}[31mx{ESC}[0m{ESC}[K", "x"),
    # Partial sequences, as at the end of a chunk: nothing is guessed, they stay as they are.
    "a lone ESC at the end": (f"tail {ESC}", f"tail {ESC}"),
    "ESC [ at the end": (f"tail {ESC}[", f"tail {ESC}["),
    "a CSI without its final byte": (f"tail {ESC}[1;3", f"tail {ESC}[1;3"),
    # The log view strips each read on its own, so a sequence cut between reads shows its halves.
    "the first half of a cut CSI": (f"step 2 {ESC}[1;", f"step 2 {ESC}[1;"),
    "the second half of a cut CSI": ("31mERROR", "31mERROR"),
    # Any byte from @ to ~ ends a CSI, so an unterminated one takes the next letter with it.
    "a CSI ended by the next letter": (f"{ESC}[31hello", "ello"),
    "an unterminated OSC: only ESC ] goes": (f"{ESC}]0;title never ends", "0;title never ends"),
    "an OSC cut by another sequence": (f"{ESC}]0;t{ESC}[31mred", "0;tred"),
    # Not covered: two-byte escapes below @ or above _ (ESC 7 and ESC 8 save and restore the
    # cursor, ESC c resets the terminal) stay in the text.
    "ESC 7, ESC 8 and ESC c stay": (f"{ESC}7saved{ESC}8 {ESC}c", f"{ESC}7saved{ESC}8 {ESC}c"),
}


@pytest.mark.parametrize("case", ANSI_CASES)
def test_ansi_stripper(scripts, case):
    text, expected = ANSI_CASES[case]
    # Twice: the pattern is global, and a stale lastIndex must not change the second answer.
    assert scripts.evaluate("text => [C.stripAnsi(text), C.stripAnsi(text)]", text) == [expected, expected]


def test_the_detail_pane_shows_the_jobs_webhook_deliveries(serve, recorder, page, database):
    server = serve(write_token="w-ui", read_token="r-ui", webhook_poll_s=0.05, **FAST)
    taken = recorder(script=lambda request, recorder: (200, {}, b"ok"))
    refused = recorder(script=lambda request, recorder: (500, {}, b"no"))
    for url in (taken.url, refused.url):
        assert server.post("/api/webhooks", json={"url": url, "statuses": ["failed"]}).status_code == 201
    body = {"job_id": "7001", "job_name": "hooked", "cluster": "gb300", "submitted_at": at(0)}
    assert server.post("/api/jobs", json=body).status_code == 201
    put(server, "7001", "failed", message="Job failed with exit code 3", exit_code=3, updated_at=at(5),
        metadata={"cluster": "gb300"})
    wait_for(lambda: database.scalar("SELECT count(*) FROM webhook_deliveries WHERE state = 'sent' OR attempts > 0")
             == 2, 10, "one delivery sent and the other tried")
    open_page(page, server, "?job=7001&job_cluster=gb300")
    page.wait_for_selector("table.deliveries tbody tr >> nth=1")
    rows = page.evaluate("""() => [...document.querySelectorAll('table.deliveries tbody tr')].map(tr =>
        [tr.className, ...[...tr.cells].map(td => td.textContent.trim())])""")
    assert [row[:3] for row in rows] == [["sent", "✗ failed", "webhook 1"], ["pending", "✗ failed", "webhook 2"]]
    assert re.fullmatch(r"sent \d{4}-\d\d-\d\d \d\d:\d\d:\d\d", rows[0][3]), rows[0]
    assert re.fullmatch(r"retrying: \d+ tr(y|ies), answered 500; next \d{4}-\d\d-\d\d \d\d:\d\d:\d\d", rows[1][3]), rows
    assert taken.url not in page.content() and refused.url not in page.content()

