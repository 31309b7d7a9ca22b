"""collector.probe against live collectors, with canned sinfo/squeue results.

tests/test_slurm_live.py runs the real ones.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from collector import probe
from collector.reporter.status import StatusReporter
from collector.reporter.transport import Transport


class FakeCollect:
    """Stands in for collector.slurm.collect: records each watch and answers from ``result``."""

    def __init__(self, **result):
        self.result = {"error": None, "nodes": [{"name": "n1", "state": "idle", "reason": None}],
                       "partitions": [{"name": "batch", "state": "up"}], "jobs": [], "queried_job_ids": [],
                       **result}
        self.watches: list[list[str]] = []

    def __call__(self, watch):
        self.watches.append(list(watch))
        return dict(self.result)


def transport(*servers) -> Transport:
    return Transport([s.url for s in servers], servers[0].token)


def status(server, cluster):
    return server.get(f"/api/clusters/{cluster}/status").json()


def test_first_cycle_learns_the_watch_then_follows_the_put_answers(api):
    sender = transport(api)
    for job_id, started in (("71", True), ("72", False)):
        reporter = StatusReporter(sender, job_id, cluster="c1")
        assert reporter.create(f"job-{job_id}")
        if started:
            assert reporter.report_started()
    fake = FakeCollect(nodes=[{"name": "n1", "state": "drained", "reason": "disk check"},
                              {"name": "n2", "state": "idle", "reason": None}])
    watch = probe.run_once("c1", sender, None, interval_s=30, collect=fake)
    # Learned from GET before sinfo ran, so squeue is asked about the active jobs at once.
    assert sorted(fake.watches[0]) == ["71", "72"]
    assert sorted(watch) == ["71", "72"]
    state = status(api, "c1")
    assert (state["status"], state["detail"]) == ("degraded", "n1 drained (disk check)")
    # Later cycles use what the PUT answered, without another GET.
    fake.result["jobs"] = [{"job_id": "72", "state": "PENDING", "reason": "Priority"}]
    fake.result["queried_job_ids"] = ["71", "72"]
    assert sorted(probe.run_once("c1", sender, watch, collect=fake)) == ["71", "72"]
    assert fake.watches[1] == watch
    queued = {j["job_id"]: j for j in status(api, "c1")["active_jobs"]}["72"]
    assert (queued["phase"], queued["reason"]) == ("queued", "Priority")


def test_a_failed_sinfo_reports_the_error(api):
    fake = FakeCollect(error="slurm_load_partitions: Unable to contact slurm controller (connect failure)",
                       nodes=[], partitions=[])
    probe.run_once("c2", transport(api), None, collect=fake)
    state = status(api, "c2")
    assert (state["status"], state["detail"]) == (
        "unavailable", "slurm_load_partitions: Unable to contact slurm controller (connect failure)")


def test_several_endpoints_each_get_the_report_and_watches_are_joined(serve):
    token = "w-probe"
    first, second = serve(write_token=token), serve(write_token=token)
    assert StatusReporter(Transport([first.url], token), "81", cluster="c3").create("a")
    assert StatusReporter(Transport([second.url], token), "82", cluster="c3").create("b")
    fake = FakeCollect()
    watch = probe.run_once("c3", transport(first, second), None, collect=fake)
    assert sorted(fake.watches[0]) == ["81", "82"]
    assert sorted(watch) == ["81", "82"]
    assert status(first, "c3")["status"] == status(second, "c3")["status"] == "available"


def test_no_collector_keeps_the_watch(api):
    dead = Transport(["http://127.0.0.1:9"], None, timeout=1, attempts=1)
    assert probe.run_once("c4", dead, ["5", "6"], collect=FakeCollect()) == ["5", "6"]
    # Nothing learned on the first cycle either: squeue is asked about nothing.
    fake = FakeCollect()
    assert probe.run_once("c4", dead, None, collect=fake) == []
    assert fake.watches == [[]]


def test_cluster_names_are_one_path_segment():
    assert probe.status_path("a/b c") == "/api/clusters/a%2Fb%20c/status"


def test_the_in_process_thread_probes_until_stopped(api):
    fake = FakeCollect()
    runner = probe.ProbeThread("c5", api.url, api.token, interval_s=1, collect=fake).start()
    try:
        deadline = time.monotonic() + 10
        while len(fake.watches) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(fake.watches) >= 2
        assert status(api, "c5")["status"] == "available"
    finally:
        runner.stop()
    assert not any(t.name == "collector-probe-c5" for t in threading.enumerate())


def test_a_cycle_that_raises_does_not_end_the_loop(api):
    calls = []

    def flaky(watch):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return FakeCollect()(watch)

    runner = probe.ProbeThread("c6", api.url, api.token, interval_s=1, collect=flaky).start()
    try:
        deadline = time.monotonic() + 10
        while status(api, "c6").get("status") is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert status(api, "c6")["status"] == "available"
    finally:
        runner.stop()


def run_cli(*args, env=None):
    command = [sys.executable, "-c", "from collector.cli import main; main()", "probe", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": "/nonexistent", **(env or {})})


def test_cli_once_reports_and_says_what_it_sent(api):
    # PATH without Slurm: the probe reports sinfo's absence as the cluster's error.
    done = run_cli("--once", "--cluster", "c7", "--endpoint", api.url, "--token-env", "PROBE_TOKEN",
                   env={"PROBE_TOKEN": api.token})
    assert done.returncode == 0, done.stderr
    assert done.stdout == "c7: unavailable (sinfo: command not found)\n"
    assert (status(api, "c7")["status"], status(api, "c7")["detail"]) == ("unavailable", "sinfo: command not found")


@pytest.mark.parametrize(("args", "env", "code", "text"), [
    (["--once", "--cluster", "c8", "--endpoint", "http://127.0.0.1:9"], {}, 1,
     "c8: not acknowledged by any endpoint"),
    (["--once", "--endpoint", "http://127.0.0.1:9"], {"SLURM_CLUSTER_NAME": ""}, 2, "no cluster name"),
    (["--once", "--cluster", "c8"], {"COLLECTOR_ENDPOINTS": ""}, 2, "no collector endpoint"),
])
def test_cli_failures(args, env, code, text):
    done = run_cli(*args, env=env)
    assert done.returncode == code
    assert text in done.stdout + done.stderr


def test_cli_wrong_token_is_not_acknowledged(api):
    done = run_cli("--once", "--cluster", "c9", "--endpoint", api.url, env={"SRTCTL_STATUS_TOKEN": "wrong"})
    assert done.returncode == 1
    assert "HTTP 401" in done.stderr
