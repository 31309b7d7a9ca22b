"""Regenerate the dashboard's screenshots in docs/terminal/ (SVG):

    python -m tests.screenshots [DIRECTORY]

A fresh collector on SQLite in a temporary directory, jobs on two clusters (one of them
held in Slurm's queue for Resources, one failed, one running with a colourful log), then
`collector watch` driven headlessly: the jobs screen at 100x30 and at 80x24, and the
running job opened with its log followed.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import requests
from textual.pilot import Pilot
from textual.widgets import DataTable
from textual.widgets import RichLog

from collector.reader.api import Collector
from collector.reader.watch import JobScreen
from collector.reader.watch import WatchApp
from tests.processes import ROOT
from tests.processes import ServerProcess
from tests.processes import child_env
from tests.processes import collector_command

WRITE, READ = "w-screens", "r-screens"
LOG = ("\x1b[1m[2026-12-03 08:21:04] dynamo frontend\x1b[0m listening on :8000\n"
       "[2026-12-03 08:21:09] prefill worker 0 ready (4 GPUs)\n"
       "[2026-12-03 08:21:11] decode worker 0 ready (4 GPUs)\n"
       "\x1b[32m[2026-12-03 08:22:30] sa-bench concurrency 64: 1843 tok/s, TTFT p99 412 ms\x1b[0m\n"
       "\x1b[33m[2026-12-03 08:24:02] warning: KV cache 93% full\x1b[0m\n"
       "\x1b[32m[2026-12-03 08:25:40] sa-bench concurrency 128: 3310 tok/s, TTFT p99 655 ms\x1b[0m\n")


def ago(minutes: float) -> str:
    """A timestamp ``minutes`` before now, as the API writes them."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 60 * minutes))


def seed(url: str) -> None:
    """Jobs on b200 and h100: one queued for Resources, one failed, two running (one logging)."""
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {WRITE}"

    def ok(response: requests.Response) -> None:
        assert response.status_code in (200, 201), response.text

    jobs = [("4711", "dsr1-fp4-1p4d-sweep", "b200", ago(23)),
            ("4702", "llama-70b-agg-isl8k", "b200", ago(45)),
            ("9120", "qwen3-235b-disagg", "h100", ago(30)),
            ("9133", "dsr1-fp8-kv-router", "h100", ago(10))]
    for job_id, name, cluster, at in jobs:
        ok(session.post(f"{url}/api/jobs", json={"job_id": job_id, "job_name": name, "cluster": cluster,
                                                 "submitted_at": at}))
    ok(session.put(f"{url}/api/jobs/4702", json={
        "status": "failed", "stage": "benchmark", "message": "CUDA out of memory on node-3", "exit_code": 137,
        "updated_at": ago(2), "metadata": {"cluster": "b200"}}))
    ok(session.put(f"{url}/api/jobs/9120", json={
        "status": "frontend", "stage": "frontend", "message": "Inference endpoint ready",
        "started_at": ago(27), "updated_at": ago(19), "metadata": {"cluster": "h100"}}))
    ok(session.put(f"{url}/api/jobs/9133", json={
        "status": "benchmark", "stage": "benchmark", "message": "Running benchmark",
        "started_at": ago(7), "updated_at": ago(3),
        "metadata": {"cluster": "h100", "head_node": "h100-node-07", "tags": ["suite:kv-router"]}}))
    log_params: dict[str, str | int] = {"file": "frontend.out", "offset": 0, "cluster": "h100"}
    ok(session.post(f"{url}/api/jobs/9133/logs", params=log_params,
                    data=LOG.encode(), headers={"Content-Type": "application/octet-stream"}))
    probed = ago(0)
    for cluster, nodes in (("b200", [{"name": "b200-n01", "state": "alloc"},
                                     {"name": "b200-n07", "state": "drained", "reason": "bad GPU 3"}]),
                           ("h100", [{"name": "h100-n01", "state": "mixed"}])):
        ok(session.put(f"{url}/api/clusters/{cluster}/status", json={
            "probed_at": probed, "nodes": nodes, "partitions": [{"name": "batch", "state": "up"}],
            "jobs": [{"job_id": "4711", "state": "PENDING", "reason": "Resources"}] if cluster == "b200" else [],
            "queried_job_ids": ["4711"] if cluster == "b200" else []}))


async def shoot(url: str, out: Path) -> list[Path]:
    """Drive the dashboard and save its screens; the files written."""
    return [*await _jobs_then_job(url, out), *await _jobs(url, out, (80, 24), "watch-jobs-80x24.svg")]


async def _jobs_then_job(url: str, out: Path) -> list[Path]:
    app = WatchApp(Collector(url, READ))
    async with app.run_test(size=(110, 30)) as pilot:
        jobs = await _shown(app, pilot, out, "watch-jobs.svg")
        await pilot.press("enter")  # the newest job, 9133, with its log
        await _until(pilot, lambda: isinstance(app.screen, JobScreen)
                     and len(app.screen.query_one(RichLog).lines) == LOG.count("\n"))
        await pilot.pause(0.5)
        return [jobs, Path(app.save_screenshot("watch-job-log.svg", str(out)))]


async def _jobs(url: str, out: Path, size: tuple[int, int], name: str) -> list[Path]:
    app = WatchApp(Collector(url, READ))
    async with app.run_test(size=size) as pilot:
        return [await _shown(app, pilot, out, name)]


async def _shown(app: WatchApp, pilot: Pilot[None], out: Path, name: str) -> Path:
    """The jobs screen once it shows every job and follows the stream, saved as ``name``."""
    await _until(pilot, lambda: app.screen.query_one(DataTable).row_count == 4)
    await _until(pilot, lambda: "live" in str(app.screen.query_one("#status").render()))
    await pilot.pause(0.5)
    return Path(app.save_screenshot(name, str(out)))


async def _until(pilot: Pilot[None], check: Callable[[], object], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError("the dashboard did not show what the screenshot needs")
        await pilot.pause(0.05)


def main(out: Path) -> list[Path]:
    """Start a collector, seed it, write the screenshots to ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="collector-screens-") as tmp:
        server = ServerProcess(collector_command("serve", "--port", "0", "--db", str(Path(tmp) / "screens.db")),
                               child_env(SRTCTL_STATUS_TOKEN=WRITE, SRTCTL_STATUS_READ_TOKEN=READ))
        try:
            seed(server.url)
            return asyncio.run(shoot(server.url, out))
        finally:
            server.stop()


if __name__ == "__main__":
    for path in main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "terminal"):
        print(path)
