"""Run ``sinfo`` and ``squeue`` and parse them into the body of ``PUT /api/clusters/{cluster}/status``.

One ``sinfo -h -N -o '%N|%T|%P|%a|%E'`` gives both the nodes and the partitions: one line per
node per partition, so a node in several partitions is reported once (its first line) and each
partition once. A partition with no nodes is not listed by ``sinfo -N``; it cannot run a job
anyway. ``sinfo`` without ``--all`` shows what the probing user sees: hidden partitions are left
out. Reasons come last in each line, so a ``|`` inside one survives.

Watched jobs are asked for with ``squeue -h -t all -j ID,ID,... -o '%A|%i|%T|%r'`` in chunks of
``JOB_CHUNK`` ids. On Slurm 22.05 a list of ids answers the known ones and leaves out the unknown
(rc 0), but a *single* unknown id fails with "slurm_load_jobs error: Invalid job id specified"
(rc 1): that answer means "not in the queue" and is read as an empty list, so one unknown id never
hides the others. Asking for the ids is cheaper than listing every job of a busy cluster every
cycle. ``%A`` is the job's own id (an array task's too), ``%i`` the display id (``123_4``,
``123_[5-9]`` for the pending rest); a watched id matches either, ``%i`` first. Ids that are not
Slurm job ids (``123`` or ``123_4``) are never sent to squeue and not listed in
``queried_job_ids``, and neither are the ids of a chunk whose squeue failed otherwise: the
collector only concludes that a job left the queue from an answer that says so.

A failed command (not found, timed out, non-zero exit) gives ``error``, the first line of its
stderr; after a failed sinfo no squeue is run (a dead slurmctld takes ~9 s per command to fail).
"""

from __future__ import annotations

import dataclasses
import logging
import re
import subprocess
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Sequence
from typing import TypedDict

log = logging.getLogger("collector.slurm")

TIMEOUT_S = 20.0
JOB_CHUNK = 200
SINFO = ("sinfo", "--noheader", "--Node", "--format=%N|%T|%P|%a|%E")
SQUEUE = ("squeue", "--noheader", "--states=all", "--format=%A|%i|%T|%r")
NO_REASON = frozenset({"", "none", "(null)"})
UNKNOWN_SINGLE_JOB = "Invalid job id specified"
JOB_ID = re.compile(r"\d+(_\d+)?")


@dataclasses.dataclass(frozen=True)
class Result:
    """A command's stdout when it succeeded, else ``error``: one line saying why it failed."""

    stdout: str
    error: str | None = None


Runner = Callable[[Sequence[str], float], Result]


class Node(TypedDict):
    """One node as sinfo reports it."""

    name: str
    state: str
    reason: str | None


class Partition(TypedDict):
    """One partition and its availability."""

    name: str
    state: str


class Job(TypedDict):
    """One watched job as squeue reports it."""

    job_id: str
    state: str
    reason: str | None


class Probe(TypedDict):
    """The result of :func:`collect`: the body of the status report, less its timing."""

    error: str | None
    nodes: list[Node]
    partitions: list[Partition]
    jobs: list[Job]
    queried_job_ids: list[str]


def run_command(argv: Sequence[str], timeout: float = TIMEOUT_S) -> Result:
    """Run one Slurm command with a timeout; never raises."""
    name = argv[0]
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, errors="replace",
                              timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        return Result("", f"{name}: command not found")
    except subprocess.TimeoutExpired:
        return Result("", f"{name} timed out after {timeout:g} s")
    except OSError as exc:
        return Result("", f"{name}: {exc.strerror or exc}")
    if done.returncode != 0:
        first = next((line.strip() for line in done.stderr.splitlines() if line.strip()), "")
        return Result(done.stdout, first or f"{name} exited with status {done.returncode}")
    return Result(done.stdout)


def _reason(text: str) -> str | None:
    text = text.strip()
    return None if text.lower() in NO_REASON else text


def parse_sinfo(text: str) -> tuple[list[Node], list[Partition]]:
    """Nodes and partitions from ``sinfo -h -N -o '%N|%T|%P|%a|%E'`` output, each once, in sinfo's order."""
    nodes: dict[str, Node] = {}
    partitions: dict[str, Partition] = {}
    for line in text.splitlines():
        fields = line.split("|", 4)
        if len(fields) < 5 or not fields[0].strip():
            continue
        name, state, partition, avail, reason = fields
        name = name.strip()
        nodes.setdefault(name, {"name": name, "state": state.strip().lower(), "reason": _reason(reason)})
        # '*' marks the default partition; it is no part of the name.
        partition = partition.strip().removesuffix("*")
        if partition:
            partitions.setdefault(partition, {"name": partition, "state": avail.strip().lower()})
    return list(nodes.values()), list(partitions.values())


def parse_squeue(text: str, watched: Iterable[str]) -> list[Job]:
    """One entry per watched id found in ``squeue -o '%A|%i|%T|%r'`` output (matched on %i, else %A)."""
    by_display: dict[str, tuple[str, str | None]] = {}
    by_id: dict[str, tuple[str, str | None]] = {}
    for line in text.splitlines():
        fields = line.split("|", 3)
        if len(fields) < 4:
            continue
        job_id, display, state, reason = (field.strip() for field in fields)
        entry = (state.upper(), _reason(reason))
        by_display.setdefault(display, entry)
        by_id.setdefault(job_id, entry)
    jobs: list[Job] = []
    for job_id in watched:
        known = by_display.get(job_id) or by_id.get(job_id)
        if known:
            jobs.append({"job_id": job_id, "state": known[0], "reason": known[1]})
    return jobs


def slurm_job_ids(ids: Iterable[str]) -> list[str]:
    """The ids squeue can be asked about (``123`` or ``123_4``), each once, in order."""
    return list(dict.fromkeys(i.strip() for i in ids if JOB_ID.fullmatch(i.strip())))


def query_jobs(ids: Iterable[str], *, run: Runner = run_command,
               timeout: float = TIMEOUT_S) -> tuple[list[Job], list[str]]:
    """Watched jobs as squeue sees them, and the ids actually answered for (``queried_job_ids``)."""
    wanted = slurm_job_ids(ids)
    jobs: list[Job] = []
    queried: list[str] = []
    for start in range(0, len(wanted), JOB_CHUNK):
        chunk = wanted[start:start + JOB_CHUNK]
        result = run([*SQUEUE, "--jobs=" + ",".join(chunk)], timeout)
        if result.error and not (len(chunk) == 1 and UNKNOWN_SINGLE_JOB in result.error):
            log.warning("squeue failed for %d watched jobs: %s", len(chunk), result.error)
            continue
        jobs.extend(parse_squeue(result.stdout if not result.error else "", chunk))
        queried.extend(chunk)
    return jobs, queried


def collect(watch: Iterable[str] = (), *, run: Runner = run_command, timeout: float = TIMEOUT_S) -> Probe:
    """One probe: ``nodes``, ``partitions`` and ``error`` from sinfo, ``jobs`` and ``queried_job_ids`` from squeue."""
    result = run(SINFO, timeout)
    if result.error:
        return {"error": result.error, "nodes": [], "partitions": [], "jobs": [], "queried_job_ids": []}
    nodes, partitions = parse_sinfo(result.stdout)
    jobs, queried = query_jobs(watch, run=run, timeout=timeout)
    return {"error": None, "nodes": nodes, "partitions": partitions, "jobs": jobs, "queried_job_ids": queried}
