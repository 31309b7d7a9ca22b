"""Real Slurm, end to end: sbatch jobs under ``collector wrap`` and ``collector probe`` against a live collector.

Needs a Slurm that answers (``bash .ci/slurm-local.sh up``; CI starts it, and strict mode fails a
skip). The tests that drain the node or stop slurmctld need that single-node cluster (node
``localhost``, slurmctld's pid in /run/slurmctld.pid) and restore it in a ``finally``. Batch jobs
reach the collector on 127.0.0.1; everything is polled with deadlines.
"""

from __future__ import annotations

import functools
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from typing import TypeVar

import pytest

from collector import probe
from collector import slurm
from collector.reporter.status import StatusReporter
from collector.reporter.transport import Transport
from tests.helpers import wait_for

ROOT = pathlib.Path(__file__).resolve().parent.parent
NODE = "localhost"
CTLD_PID = pathlib.Path("/run/slurmctld.pid")
SETUP = ROOT / ".ci" / "slurm-local.sh"
USABLE = ("idle", "mixed", "allocated")
T = TypeVar("T")


@functools.cache
def slurm_missing() -> str | None:
    """Why the live tests cannot run here, or None."""
    if not shutil.which("sinfo") or not shutil.which("sbatch"):
        return "needs Slurm (sinfo/sbatch not on PATH): run `bash .ci/slurm-local.sh up`"
    result = slurm.run_command(["sinfo", "-h", "-o", "%N"], 20)
    if result.error:
        return f"needs a Slurm that answers (`bash .ci/slurm-local.sh up`): sinfo: {result.error}"
    return None


pytestmark = pytest.mark.skipif(slurm_missing() is not None, reason=slurm_missing() or "")


def _ctld_pid() -> int | None:
    try:
        pid = int(CTLD_PID.read_text().strip())
        return pid if pathlib.Path(f"/proc/{pid}/comm").read_text().strip() == "slurmctld" else None
    except (OSError, ValueError):
        return None


def need_local_cluster():
    """Skip unless this is the single-node cluster of .ci/slurm-local.sh (never drain a real one)."""
    if _ctld_pid() is None or node_state() is None:
        pytest.skip(f"needs the single-node Slurm of .ci/slurm-local.sh (node {NODE}, {CTLD_PID})")


def node_state() -> str | None:
    done = subprocess.run(["sinfo", "-h", "-N", "-n", NODE, "-o", "%T"], capture_output=True, text=True, timeout=30)
    return done.stdout.strip() or None if done.returncode == 0 else None


def slurm_wait(what: str, check: Callable[[], T | None], timeout: float = 60, every: float = 0.2) -> T:
    """tests/helpers.py's ``wait_for`` at Slurm's pace: longer waits, slower polls."""
    return wait_for(check, timeout, what, every)


def wait_usable(timeout: float = 60) -> str:
    """Until the node can run jobs again (it shows idle* or unknown for a few seconds after restarts)."""
    return slurm_wait(f"node {NODE} usable", lambda: s if (s := node_state()) in USABLE else None, timeout)


def scontrol(*args: str) -> None:
    subprocess.run(["scontrol", *args], check=True, capture_output=True, timeout=30)


@functools.cache
def cluster_name() -> str:
    """The cluster's name, as SLURM_CLUSTER_NAME gives it to jobs (hence to ``collector wrap``)."""
    done = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30, check=True)
    for line in done.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "ClusterName":
            return value.strip()
    raise AssertionError("no ClusterName in scontrol show config")


def collector_command() -> list[str]:
    """The ``collector`` of this Python (its console script when installed next to it)."""
    script = pathlib.Path(sys.executable).with_name("collector")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from collector.cli import main; main()"]


class Batch:
    """Submits batch scripts for one test and cancels whatever is left at the end."""

    def __init__(self, api, workdir: pathlib.Path) -> None:
        self.api = api
        self.workdir = workdir
        self.jobs: list[str] = []
        # --export=ALL (sbatch's default) hands the job this environment: the endpoint and token.
        self.env = {**os.environ, "COLLECTOR_ENDPOINTS": api.url, "SRTCTL_STATUS_TOKEN": api.token or "",
                    "PATH": f"{pathlib.Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}

    def submit(self, body: str, *sbatch_args: str, name: str = "live") -> str:
        script = self.workdir / f"{name}-{len(self.jobs)}.sh"
        script.write_text(f"#!/bin/sh\n{body}\n")
        done = subprocess.run(["sbatch", "--parsable", "-J", name, "-o", str(self.workdir / "slurm-%j.out"),
                               *sbatch_args, str(script)],
                              capture_output=True, text=True, timeout=30, env=self.env, cwd=self.workdir, check=True)
        job_id = done.stdout.strip().split(";")[0]
        self.jobs.append(job_id)
        return job_id

    def wrap(self, command: str, *sbatch_args: str, name: str = "live", before: str = "") -> str:
        wrapper = " ".join(shlex.quote(part) for part in collector_command())
        return self.submit(f"{before}\nexec {wrapper} wrap --interval 0.5 -- {command}", *sbatch_args, name=name)

    def slurm_state(self, job_id: str) -> str:
        done = subprocess.run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"], capture_output=True,
                              text=True, timeout=30)
        return done.stdout.strip()

    def output(self, job_id: str) -> str:
        path = self.workdir / f"slurm-{job_id}.out"
        return path.read_text(errors="replace") if path.exists() else "(no output file)"

    def cancel_all(self) -> None:
        if self.jobs:
            subprocess.run(["scancel", *self.jobs], capture_output=True, timeout=30)


@pytest.fixture
def batch(api, tmp_path):
    """Batch jobs that report to a live collector (``api``); all cancelled after the test."""
    wait_usable()
    jobs = Batch(api, tmp_path)
    yield jobs
    jobs.cancel_all()


def job(api, job_id: str) -> dict:
    response = api.get(f"/api/jobs/{job_id}")
    return response.json() if response.status_code == 200 else {}


def finished(api, job_id: str, batch: Batch) -> dict:
    """The job once the collector holds a terminal status for it."""
    def check():
        found = job(api, job_id)
        return found if found.get("status") in ("completed", "failed") else None
    try:
        return slurm_wait(f"job {job_id} to finish in the collector", check, 90)
    except AssertionError:  # wait_for's timeout
        print(f"slurm: {batch.slurm_state(job_id)}\n{batch.output(job_id)}")
        raise


def run_probe(api) -> dict:
    """One real probe cycle (sinfo + squeue) reported to the collector; the cluster as GET /api/clusters shows it."""
    sender = Transport([api.url], api.token)
    try:
        probe.run_once(cluster_name(), sender, None, interval_s=30)
    finally:
        sender.close()
    clusters = api.get("/api/clusters").json()["clusters"]
    return next(c for c in clusters if c["cluster"] == cluster_name())


def test_wrapped_job_lands_its_lifecycle_log_and_exit_code(api, batch):
    job_id = batch.wrap("sh -c 'echo line-one; sleep 1; echo line-two >&2'", name="wrapped-ok")
    found = finished(api, job_id, batch)
    assert (found["status"], found["exit_code"], found["cluster"]) == ("completed", 0, cluster_name())
    assert found["job_name"] == "wrapped-ok"
    statuses = [event["status"] for event in found["events"]]
    assert statuses[0] == "starting" and statuses[-1] == "completed", statuses
    log = api.get(f"/api/jobs/{job_id}/logs", params={"file": f"wrap-{job_id}.out"}).json()
    assert "line-one" in log["data"] and "line-two" in log["data"]
    assert log["final"] is True
    assert slurm_wait("Slurm to see the job completed", lambda: batch.slurm_state(job_id) == "COMPLETED")


def test_failing_job_lands_failed_with_its_exit_code(api, batch):
    job_id = batch.wrap("sh -c 'echo about to fail; exit 3'", name="wrapped-fail")
    found = finished(api, job_id, batch)
    assert (found["status"], found["exit_code"]) == ("failed", 3)
    assert slurm_wait("Slurm to see the job failed", lambda: batch.slurm_state(job_id) == "FAILED")


def test_scancel_of_a_running_job_ends_failed(api, batch):
    job_id = batch.wrap("sleep 300", name="wrapped-cancel")
    slurm_wait("the job to start", lambda: job(api, job_id).get("status") in ("starting", "running"))
    subprocess.run(["scancel", job_id], check=True, timeout=30)
    found = finished(api, job_id, batch)
    assert found["status"] == "failed"
    assert "cancelled" in (found["message"] or "").lower(), found["message"]
    assert slurm_wait("Slurm to see the job cancelled", lambda: batch.slurm_state(job_id) == "CANCELLED")


def test_job_held_back_by_a_full_node_shows_queued_with_its_reason(api, batch):
    cpus = int(subprocess.run(["sinfo", "-h", "-N", "-n", NODE, "-o", "%c"], capture_output=True, text=True,
                              timeout=30, check=True).stdout.strip() or 0)
    if not cpus:
        need_local_cluster()
    fillers = [batch.submit("sleep 300", "-c", "1", name="filler") for _ in range(cpus)]
    slurm_wait("the node to fill", lambda: all(batch.slurm_state(j) == "RUNNING" for j in fillers))
    # As srtctl does: sbatch, then create the job in the collector with Slurm's id.
    waiting = batch.submit("sleep 1", "-c", "1", name="held")
    after = batch.submit("sleep 1", "-c", str(cpus), name="held-after")
    sender = Transport([api.url], api.token)
    for job_id in (waiting, after):
        assert StatusReporter(sender, job_id, cluster=cluster_name()).create(f"held-{job_id}")

    def queued():
        state = run_probe(api)
        active = {j["job_id"]: j for j in state["active_jobs"]}
        # Slurm shows a fresh job PENDING with reason None for about a second.
        reasons = {j: (active.get(j) or {}).get("reason") for j in (waiting, after)}
        return (state, active) if all(reasons.values()) else None

    state, active = slurm_wait("both jobs queued with a reason", queued, 60, every=0.5)
    for job_id in (waiting, after):
        assert active[job_id]["phase"] == "queued"
        assert active[job_id]["reason"] in ("Resources", "Priority"), active[job_id]
    # A full node is busy, not impaired.
    assert (state["status"], state["detail"]) == ("available", None)


def test_draining_the_node_degrades_the_cluster_with_the_reason(api, batch):
    need_local_cluster()
    reason = "collector-test drain"
    try:
        scontrol("update", f"nodename={NODE}", "state=drain", f"reason={reason}")
        slurm_wait("the node drained", lambda: node_state() == "drained")
        state = run_probe(api)
        assert (state["status"], state["detail"]) == ("degraded", f"{NODE} drained ({reason}); no usable nodes")
        assert state["probe_silent"] is False
    finally:
        scontrol("update", f"nodename={NODE}", "state=resume")
        wait_usable()
    assert run_probe(api)["status"] == "available"


def test_stopping_slurmctld_makes_the_cluster_unavailable_with_the_probe_error(api, batch):
    need_local_cluster()
    pid = _ctld_pid()
    assert pid is not None, "need_local_cluster() found slurmctld"
    try:
        os.kill(pid, 15)
        slurm_wait("slurmctld to exit", lambda: not pathlib.Path(f"/proc/{pid}").exists(), 30)
        # sinfo retries for about 9 s before it gives up.
        state = run_probe(api)
        assert state["status"] == "unavailable"
        assert state["detail"] == "slurm_load_partitions: Unable to contact slurm controller (connect failure)"
    finally:
        # Starts only what is not running (slurmctld) and waits until the node is usable again.
        subprocess.run(["bash", str(SETUP), "up"], check=True, timeout=120, capture_output=True)
        wait_usable()
    assert run_probe(api)["status"] == "available"


def test_a_job_killed_hard_is_marked_failed_once_it_left_the_queue(serve, tmp_path):
    wait_usable()
    api = serve(write_token="w-live", stale_grace_s=1.0, stale_check_s=0.5)
    jobs = Batch(api, tmp_path)
    try:
        pid_file = tmp_path / "wrapper.pid"
        # exec: the wrapper keeps the batch shell's pid, which the script writes down first.
        job_id = jobs.wrap("sleep 300", name="wrapped-killed", before=f"echo $$ > {shlex.quote(str(pid_file))}")
        slurm_wait("the job to start", lambda: job(api, job_id).get("status") in ("starting", "running"))
        # SIGKILL to the wrapper itself (the node dying, the OOM killer): it cannot report anything.
        # scancel --signal=KILL would not do: Slurm cancels with SIGTERM first, which the wrapper reports.
        os.kill(int(pid_file.read_text()), 9)
        slurm_wait("Slurm to end the job", lambda: jobs.slurm_state(job_id) in ("FAILED", "CANCELLED"))
        assert job(api, job_id)["status"] in ("starting", "running")

        def marked():
            run_probe(api)  # each report triggers the stale check at once
            found = job(api, job_id)
            return found if found.get("status") == "failed" else None

        found = slurm_wait("the collector to mark the job failed", marked, 30, every=0.5)
        assert "marked failed by the collector" in found["message"], found["message"]
        assert "Slurm reported the job" in found["message"], found["message"]
    finally:
        jobs.cancel_all()
