"""`collector watch` driven headlessly (Textual's pilot) against a live collector."""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import Awaitable
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable
from textual.widgets import RichLog
from textual.widgets import Static

from collector.reader import watch
from collector.reader.api import Collector
from collector.reader.watch import Chips
from collector.reader.watch import JobScreen
from collector.reader.watch import WatchApp
from tests.helpers import Restartable
from tests.helpers import put
from tests.helpers import reported
from tests.helpers import submit
from tests.processes import child_env
from tests.processes import run

OCTET = {"Content-Type": "application/octet-stream"}
Scenario = Callable[[WatchApp, Pilot[None]], Awaitable[None]]


@pytest.fixture
def api(serve):
    return serve(write_token="w-" + uuid.uuid4().hex, read_token="r-" + uuid.uuid4().hex)


def drive(url: str, token: str, scenario: Scenario, *, size: tuple[int, int] = (120, 30), **options: Any) -> None:
    """Run the dashboard against the collector at ``url`` in a headless terminal of ``size`` while ``scenario`` acts."""
    async def main() -> None:
        app = WatchApp(Collector(url, token), **options)
        async with app.run_test(size=size) as pilot:
            await scenario(app, pilot)
    asyncio.run(main())


async def until(pilot: Pilot[None], check: Callable[[], Any], timeout: float, what: str,
                shown: Callable[[], Any] = lambda: None) -> float:
    """Let the app run until ``check()`` is true; the seconds it took (a failure says what ``shown()`` was)."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout, f"timed out after {timeout:g} s waiting for {what}: {shown()}"
        await pilot.pause(0.05)
    return time.monotonic() - started


def rows(app: WatchApp) -> list[list[str]]:
    table = app.screen.query_one(DataTable)
    return [[getattr(cell, "plain", str(cell)) for cell in table.get_row_at(i)] for i in range(table.row_count)]


def text_of(widget: Static) -> str:
    content = widget.render()
    return getattr(content, "plain", str(content))


def seed(api) -> None:
    """Two clusters: b200 with a failed job and one Slurm holds for Resources; h100 with one running."""
    submit(api, "41", cluster="b200", submitted_at="2026-12-03T08:00:00Z")
    submit(api, "42", cluster="b200", submitted_at="2026-12-03T08:10:00Z")
    assert put(api, "42", "failed", message="OOM on node-3", exit_code=137, updated_at="2026-12-03T08:40:00Z",
               metadata={"cluster": "b200"}).status_code == 200
    submit(api, "77", cluster="h100", submitted_at="2026-12-03T08:20:00Z")
    assert put(api, "77", "workers", stage="workers", message="Starting workers", updated_at="2026-12-03T08:21:00Z",
               metadata={"cluster": "h100"}).status_code == 200
    reported(api, "b200", jobs=[{"job_id": "41", "state": "PENDING", "reason": "Resources"}],
             queried_job_ids=["41"])


def test_it_shows_the_clusters_and_the_jobs_newest_first_with_queue_reasons(api):
    seed(api)

    async def scenario(app: WatchApp, pilot: Pilot[None]) -> None:
        await until(pilot, lambda: len(rows(app)) == 3, 10, "three jobs")
        assert [row[:5] for row in rows(app)] == [
            ["77", "n-77", "h100", "workers", "workers"],
            ["42", "n-42", "b200", "failed (137)", "-"],
            ["41", "n-41", "b200", "submitted (Resources)", "-"],
        ]
        assert rows(app)[1][6] == "30m00s"  # elapsed: submitted 08:10, failed 08:40
        await until(pilot, lambda: "b200 available" in text_of(app.screen.query_one(Chips)), 5, "the chips")
        chips = text_of(app.screen.query_one(Chips))
        assert "h100 no probe" in chips
        status = text_of(app.screen.query_one("#status", Static))
        assert status.startswith("page 1/1, 3 jobs | live")

    drive(api.url, api.settings.read_token, scenario)


def test_a_change_shows_within_two_seconds_and_search_filters(api):
    seed(api)

    async def scenario(app: WatchApp, pilot: Pilot[None]) -> None:
        await until(pilot, lambda: len(rows(app)) == 3, 10, "three jobs")
        await pilot.pause(1.0)  # the event stream is open
        assert put(api, "77", "benchmark", stage="benchmark", message="Running benchmark",
                   updated_at="2026-12-03T08:30:00Z", metadata={"cluster": "h100"}).status_code == 200
        took = await until(pilot, lambda: rows(app)[0][3] == "benchmark", 5, "the change")
        assert took < 2
        await pilot.press("slash", *"n-4", "enter")
        await until(pilot, lambda: [row[0] for row in rows(app)] == ["42", "41"], 5, "the search")
        assert "search 'n-4'" in text_of(app.screen.query_one("#status", Static))
        await pilot.press("escape")
        await until(pilot, lambda: len(rows(app)) == 3, 5, "the search cleared")

    drive(api.url, api.settings.read_token, scenario)


def test_a_job_opens_with_its_timeline_and_its_log_followed(api):
    seed(api)
    first = "".join(f"step {n}\n" for n in range(3))
    assert api.post("/api/jobs/77/logs", params={"file": "worker.out", "offset": 0, "cluster": "h100"},
                    data=first.encode(), headers=dict(OCTET)).status_code == 200

    async def scenario(app: WatchApp, pilot: Pilot[None]) -> None:
        await until(pilot, lambda: len(rows(app)) == 3, 10, "three jobs")
        await pilot.press("enter")  # the cursor is on the newest job, 77
        await until(pilot, lambda: isinstance(app.screen, JobScreen), 5, "the job's screen")
        screen = app.screen
        assert isinstance(screen, JobScreen)
        log = screen.query_one(RichLog)
        await until(pilot, lambda: len(log.lines) == 3, 10, "the log's lines")
        detail = text_of(screen.query_one("#detail", Static))
        assert detail.startswith("Job:        77\nName:       n-77\nCluster:    h100\nStatus:     workers")
        assert "+1m00s" in detail  # submitted 08:20, workers 08:21
        more = "step 3 \x1b[31mred\x1b[0m\n"
        assert api.post("/api/jobs/77/logs", params={"file": "worker.out", "offset": len(first), "cluster": "h100"},
                        data=more.encode(), headers=dict(OCTET)).status_code == 200
        await until(pilot, lambda: len(log.lines) == 4, 5, "the followed line")
        assert [strip.text for strip in log.lines] == ["step 0", "step 1", "step 2", "step 3 red"]
        await pilot.press("slash", *"step 1", "enter")
        await until(pilot, lambda: [s.text for s in log.lines] == ["step 1"], 5, "the filtered log")
        await pilot.press("escape")
        await until(pilot, lambda: len(rows(app)) == 3 and not isinstance(app.screen, JobScreen), 5, "the list")

    drive(api.url, api.settings.read_token, scenario)


def test_it_fits_80_by_24_and_pages_through_many_jobs(api):
    for n in range(120):
        submit(api, f"p{n:03d}", cluster="b200", submitted_at=f"2026-12-03T{8 + n // 60:02d}:{n % 60:02d}:00Z")

    async def scenario(app: WatchApp, pilot: Pilot[None]) -> None:
        await until(pilot, lambda: len(rows(app)) == 50, 10, "a page")
        assert rows(app)[0][0] == "p119"
        assert text_of(app.screen.query_one("#status", Static)).startswith("page 1/3, 120 jobs")
        await pilot.press("n", "n")
        await until(pilot, lambda: rows(app) and rows(app)[0][0] == "p019", 5, "the third page")
        assert len(rows(app)) == 20
        await pilot.press("p")
        await until(pilot, lambda: rows(app)[0][0] == "p069", 5, "the second page")

    drive(api.url, api.settings.read_token, scenario, size=(80, 24))


def test_it_says_it_polls_while_the_collector_is_away_and_resumes_after_it_restarts(database):
    database.clean()
    collector = Restartable(database.url, "w-watch")
    collector.write("r1", "starting")

    async def scenario(app: WatchApp, pilot: Pilot[None]) -> None:
        await until(pilot, lambda: [row[:4] for row in rows(app)] == [["r1", "job-r1", "b200", "starting"]], 10,
                    "r1", lambda: rows(app))
        await pilot.pause(1.0)
        collector.stop()
        status = app.screen.query_one("#status", Static)
        await until(pilot, lambda: "polling" in text_of(status), 15, "the outage said", lambda: text_of(status))
        collector.start()
        collector.write("r1", "workers")
        collector.write("r2", "starting")
        await until(pilot, lambda: [row[:4] for row in rows(app)] == [["r2", "job-r2", "b200", "starting"],
                                                                       ["r1", "job-r1", "b200", "workers"]], 45,
                    "the events written after the restart")

    try:
        drive(collector.url, "w-watch", scenario)
    finally:
        collector.stop()


def test_the_screenshots_command_shows_two_clusters_a_queue_reason_and_a_followed_log(tmp_path):
    written = run([sys.executable, "-m", "tests.screenshots", str(tmp_path)], child_env(), timeout=120)
    assert written.returncode == 0, written.stderr
    assert sorted(Path(line).name for line in written.stdout.split()) == [
        "watch-job-log.svg", "watch-jobs-80x24.svg", "watch-jobs.svg"]
    jobs = (tmp_path / "watch-jobs.svg").read_text()
    # SVG text keeps spaces as &#160;
    assert all(word in jobs for word in ("b200", "h100", "degraded", "Resources", "failed&#160;(137)", "live"))
    log = (tmp_path / "watch-job-log.svg").read_text()
    assert "KV&#160;cache&#160;93%&#160;full" in log and "following" in log


def test_several_clusters_and_statuses_are_merged_newest_first(api):
    seed(api)
    submit(api, "88", cluster="gb200", submitted_at="2026-12-03T09:00:00Z")

    async def both(app: WatchApp, pilot: Pilot[None]) -> None:
        await until(pilot, lambda: [row[0] for row in rows(app)] == ["77", "42", "41"], 10, "b200 and h100",
                    lambda: rows(app))
        assert "(cluster b200, h100)" in text_of(app.screen.query_one("#status", Static))

    drive(api.url, api.settings.read_token, both, clusters=("b200", "h100"))

    async def failed_or_submitted(app: WatchApp, pilot: Pilot[None]) -> None:
        await until(pilot, lambda: [row[0] for row in rows(app)] == ["88", "42", "41"], 10, "two statuses",
                    lambda: rows(app))
        status = text_of(app.screen.query_one("#status", Static))
        assert status.startswith("page 1/1, 3 jobs (status failed, submitted)")

    drive(api.url, api.settings.read_token, failed_or_submitted, statuses=("failed", "submitted"))


def test_no_color_strips_the_log_s_colours_and_a_keeps_or_strips_them(api, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    submit(api, "55", cluster="b200")
    red = "plain then \x1b[31mred\x1b[0m\n"
    assert api.post("/api/jobs/55/logs", params={"file": "out.log", "offset": 0, "cluster": "b200"},
                    data=red.encode(), headers=dict(OCTET)).status_code == 200

    def coloured(log: RichLog) -> bool:
        return any(segment.style is not None and segment.style.color is not None
                   for strip in log.lines for segment in strip)

    async def scenario(app: WatchApp, pilot: Pilot[None]) -> None:
        await until(pilot, lambda: len(rows(app)) == 1, 10, "the job")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, JobScreen), 5, "the job's screen")
        log = app.screen.query_one(RichLog)
        await until(pilot, lambda: len(log.lines) == 1, 10, "the log line")
        assert [strip.text for strip in log.lines] == ["plain then red"] and not coloured(log)
        await pilot.press("a")  # colours kept after all
        await until(pilot, lambda: coloured(log), 5, "the red kept")
        assert "colours" in text_of(app.screen.query_one("#logstatus", Static))

    drive(api.url, api.settings.read_token, scenario)


def test_a_long_log_opens_at_its_end_with_whole_lines(api, monkeypatch):
    # The pane reads a file from 1 MiB before its end; here from 6,005 bytes, inside a line.
    monkeypatch.setattr(watch, "LOG_START_BYTES", 6005)
    submit(api, "66", cluster="b200")
    lines = [f"line {n:06d}" for n in range(2000)]  # 12 bytes each
    data = "".join(line + "\n" for line in lines).encode()
    assert api.post("/api/jobs/66/logs", params={"file": "long.out", "offset": 0, "cluster": "b200"},
                    data=data, headers=dict(OCTET)).status_code == 200

    async def scenario(app: WatchApp, pilot: Pilot[None]) -> None:
        await until(pilot, lambda: len(rows(app)) == 1, 10, "the job")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, JobScreen), 5, "the job's screen")
        screen = app.screen
        assert isinstance(screen, JobScreen)
        await until(pilot, lambda: screen.lines and screen.lines[-1] == lines[-1], 10, "the log's end")
        # From the first whole line after the start (24,000 - 6,005 is inside line 1499), to the end.
        assert screen.lines == lines[1500:]
        assert [strip.text for strip in screen.query_one(RichLog).lines] == lines[1500:]

    drive(api.url, api.settings.read_token, scenario)
