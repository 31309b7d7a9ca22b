"""collector.slurm: sinfo/squeue parsing on recorded output (tests/data/slurm), command failures, the probe body."""

from __future__ import annotations

import pathlib
import sys

import pytest

from collector import slurm
from collector.health import derive

DATA = pathlib.Path(__file__).parent / "data" / "slurm"


def read(name: str) -> str:
    return (DATA / name).read_text()


def node(name, state, reason=None):
    return {"name": name, "state": state, "reason": reason}


def part(name, state):
    return {"name": name, "state": state}


DEBUG_UP = [part("debug", "up")]


@pytest.mark.parametrize(("name", "nodes", "partitions", "status", "detail"), [
    ("idle", [node("localhost", "idle")], DEBUG_UP, "available", None),
    ("mixed", [node("localhost", "mixed")], DEBUG_UP, "available", None),
    ("allocated", [node("localhost", "allocated")], DEBUG_UP, "available", None),
    ("reserved", [node("localhost", "reserved")], DEBUG_UP, "available", None),
    ("draining", [node("localhost", "draining", "disk check")], DEBUG_UP, "degraded",
     "localhost draining (disk check); no usable nodes"),
    ("drained", [node("localhost", "drained", "disk check")], DEBUG_UP, "degraded",
     "localhost drained (disk check); no usable nodes"),
    ("down", [node("localhost", "down", "simulated outage")], DEBUG_UP, "degraded",
     "localhost down (simulated outage); no usable nodes"),
    ("maint", [node("localhost", "maint")], DEBUG_UP, "degraded", "localhost maint; no usable nodes"),
    ("unknown", [node("localhost", "unknown")], DEBUG_UP, "degraded", "localhost unknown; no usable nodes"),
    ("partition-down", [node("localhost", "idle")], [part("debug", "down")], "degraded", "partition debug down"),
    ("partition-inactive", [node("localhost", "idle")], [part("debug", "inactive")], "degraded",
     "partition debug inactive"),
    ("partition-drain", [node("localhost", "idle")], [part("debug", "drain")], "degraded", "partition debug drain"),
    # One node in two partitions: listed once; the default partition's '*' dropped.
    ("two-partitions", [node("localhost", "idle")], [part("debug", "up"), part("gpu", "down")], "degraded",
     "partition gpu down"),
    ("empty", [], [], "unavailable", "no compute nodes registered"),
    # Blank, short and nameless lines are skipped; "None" is no reason either.
    ("garbage", [node("n1", "idle")], [part("batch", "up")], "available", None),
])
def test_recorded_sinfo(name, nodes, partitions, status, detail):
    parsed = slurm.parse_sinfo(read(f"sinfo-{name}.txt"))
    assert parsed == (nodes, partitions)
    assert derive(None, *parsed) == (status, detail)


def test_many_nodes_several_partitions_and_flags():
    nodes, partitions = slurm.parse_sinfo(read("sinfo-cluster.txt"))
    assert [n["name"] for n in nodes] == ["gpu01", "gpu02", "gpu03", "cpu001", "cpu002", "cpu003", "cpu004",
                                          "cpu005", "cpu006", "cpu007", "cpu008"]
    # A '|' inside a reason survives: the reason is the last field.
    assert nodes[5] == node("cpu003", "draining", "reboot after job | ticket 42")
    assert nodes[4] == node("cpu002", "down*", "Not responding")
    assert partitions == [part("gpu", "up"), part("batch", "up"), part("long", "drain")]
    assert derive(None, nodes, partitions) == (
        "degraded", "gpu02 drained* (Kill task failed), gpu03 idle~, cpu002 down* (Not responding), +3 more; "
                    "partition long drain")


def test_no_usable_nodes():
    assert derive(None, *slurm.parse_sinfo(read("sinfo-no-usable.txt"))) == (
        "degraded", "n1 down* (Not responding), n2 drained (hw swap), n3 fail (bad dimm), +2 more; no usable nodes")


@pytest.mark.parametrize(("name", "watched", "expected"), [
    # An array job: its pending rest 2_[2-3] (job id 2) and task 2_1 (job id 3), by either id.
    ("squeue-running-pending.txt", ["1", "2", "3", "2_1", "2_[2-3]", "4"], [
        {"job_id": "1", "state": "RUNNING", "reason": None},
        {"job_id": "2", "state": "PENDING", "reason": "Resources"},
        {"job_id": "3", "state": "RUNNING", "reason": None},
        {"job_id": "2_1", "state": "RUNNING", "reason": None},
        {"job_id": "2_[2-3]", "state": "PENDING", "reason": "Resources"},
    ]),
    ("squeue-finished.txt", ["1", "3"], [
        {"job_id": "1", "state": "CANCELLED", "reason": None},
        {"job_id": "3", "state": "CANCELLED", "reason": None},
    ]),
    ("squeue-states.txt", ["4", "5", "6", "8", "9"], [
        {"job_id": "4", "state": "COMPLETED", "reason": None},
        {"job_id": "5", "state": "FAILED", "reason": "NonZeroExitCode"},
        {"job_id": "6", "state": "RUNNING", "reason": None},
        {"job_id": "8", "state": "PENDING", "reason": "Resources"},
        {"job_id": "9", "state": "PENDING", "reason": "Priority"},
    ]),
    ("squeue-pending-drained.txt", ["8"], [
        {"job_id": "8", "state": "PENDING",
         "reason": "Nodes required for job are DOWN, DRAINED or reserved for jobs in higher priority partitions"},
    ]),
    ("squeue-reqnodenotavail.txt", ["10"], [
        {"job_id": "10", "state": "PENDING", "reason": "ReqNodeNotAvail, UnavailableNodes:localhost"},
    ]),
])
def test_recorded_squeue(name, watched, expected):
    assert slurm.parse_squeue(read(name), watched) == expected


def test_every_job_state_passes_verbatim():
    lines = read("squeue-every-state.txt").splitlines()
    ids = [line.split("|")[0] for line in lines]
    jobs = slurm.parse_squeue("\n".join(lines), ids)
    assert [(j["state"], j["reason"]) for j in jobs] == [
        (line.split("|")[2], None if line.split("|")[3] == "None" else line.split("|")[3]) for line in lines]
    assert {j["state"] for j in jobs} >= {"PENDING", "RUNNING", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT",
                                          "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY"}


class FakeSlurm:
    """A Runner answering from canned results, recording every command."""

    def __init__(self, sinfo: slurm.Result, squeue=None):
        self.sinfo = sinfo
        self.squeue = squeue or (lambda ids: slurm.Result(""))
        self.calls: list[list[str]] = []

    def __call__(self, argv, timeout):
        self.calls.append(list(argv))
        assert timeout == slurm.TIMEOUT_S
        if argv[0] == "sinfo":
            return self.sinfo
        ids = next(a for a in argv if a.startswith("--jobs=")).removeprefix("--jobs=").split(",")
        return self.squeue(ids)


def squeue_22_05(known: dict[str, str]):
    """squeue -j as Slurm 22.05 answers it: a lone unknown id is an error, unknown ids in a list are left out."""
    def answer(ids):
        found = [known[i] for i in ids if i in known]
        if len(ids) == 1 and not found:
            return slurm.Result("", "slurm_load_jobs error: Invalid job id specified")
        return slurm.Result("\n".join(found) + "\n")
    return answer


def test_collect_builds_the_put_body():
    fake = FakeSlurm(slurm.Result(read("sinfo-drained.txt")),
                     squeue_22_05({"8": "8|8|PENDING|Priority", "9": "9|9|RUNNING|None"}))
    body = slurm.collect(["8", "9", "77", "not-a-slurm-id", "8"], run=fake)
    assert body == {
        "error": None,
        "nodes": [node("localhost", "drained", "disk check")],
        "partitions": DEBUG_UP,
        "jobs": [{"job_id": "8", "state": "PENDING", "reason": "Priority"},
                 {"job_id": "9", "state": "RUNNING", "reason": None}],
        # 77 was asked about and is gone; a non-Slurm id is never asked about.
        "queried_job_ids": ["8", "9", "77"],
    }
    assert fake.calls == [list(slurm.SINFO), [*slurm.SQUEUE, "--jobs=8,9,77"]]


def test_one_unknown_id_alone_means_gone_not_failed():
    fake = FakeSlurm(slurm.Result(read("sinfo-idle.txt")), squeue_22_05({}))
    assert slurm.query_jobs(["999999"], run=fake) == ([], ["999999"])


def test_many_ids_go_in_chunks_and_a_failed_chunk_is_not_queried(monkeypatch):
    monkeypatch.setattr(slurm, "JOB_CHUNK", 2)
    known = {"1": "1|1|RUNNING|None", "5": "5|5|PENDING|Resources"}

    def answer(ids):
        if "3" in ids:
            return slurm.Result("", "slurm_load_jobs error: Socket timed out on send/recv operation")
        return squeue_22_05(known)(ids)

    fake = FakeSlurm(slurm.Result(read("sinfo-idle.txt")), answer)
    jobs, queried = slurm.query_jobs(["1", "2", "3", "4", "5"], run=fake)
    assert jobs == [{"job_id": "1", "state": "RUNNING", "reason": None},
                    {"job_id": "5", "state": "PENDING", "reason": "Resources"}]
    assert queried == ["1", "2", "5"]
    assert [c[-1] for c in fake.calls] == ["--jobs=1,2", "--jobs=3,4", "--jobs=5"]


def test_no_watch_runs_no_squeue():
    fake = FakeSlurm(slurm.Result(read("sinfo-idle.txt")))
    assert slurm.collect([], run=fake)["queried_job_ids"] == []
    assert fake.calls == [list(slurm.SINFO)]


@pytest.mark.parametrize("error", [
    read("sinfo-controller-down.stderr").splitlines()[0],
    "sinfo: command not found",
    "sinfo timed out after 20 s",
])
def test_failed_sinfo_is_the_error_and_skips_squeue(error):
    fake = FakeSlurm(slurm.Result("", error))
    body = slurm.collect(["1"], run=fake)
    assert body == {"error": error, "nodes": [], "partitions": [], "jobs": [], "queried_job_ids": []}
    assert fake.calls == [list(slurm.SINFO)]
    assert derive(body["error"], body["nodes"], body["partitions"]) == ("unavailable", error)


def test_recorded_controller_down_error():
    assert read("sinfo-controller-down.stderr").splitlines()[0] == (
        "slurm_load_partitions: Unable to contact slurm controller (connect failure)")


@pytest.mark.parametrize("ids", [["1", "1", " 2 ", "3_4"], ["x", "1;rm", "-5", "2_", "_3", ""]])
def test_slurm_job_ids(ids):
    assert slurm.slurm_job_ids(ids) == ([] if "x" in ids else ["1", "2", "3_4"])


# run_command against real processes: the error text each failure gives.
@pytest.mark.parametrize(("argv", "timeout", "expected"), [
    (["no-such-command-for-collector-tests"], 5, "no-such-command-for-collector-tests: command not found"),
    ([sys.executable, "-c", "import time; time.sleep(10)"], 0.3, f"{sys.executable} timed out after 0.3 s"),
    ([sys.executable, "-c", "import sys; sys.stderr.write('\\n  boom: first\\nsecond\\n'); sys.exit(1)"], 5,
     "boom: first"),
    ([sys.executable, "-c", "import sys; sys.exit(3)"], 5, f"{sys.executable} exited with status 3"),
])
def test_run_command_errors(argv, timeout, expected):
    assert slurm.run_command(argv, timeout) == slurm.Result("", expected)


def test_run_command_success_ignores_stderr():
    result = slurm.run_command([sys.executable, "-c", "import sys; print('a|b'); sys.stderr.write('warn')"], 5)
    assert result == slurm.Result("a|b\n")
