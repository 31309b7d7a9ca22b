"""How the readers print: aligned tables, a job's facts, event lines, durations."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from typing import Any

FINISHED = frozenset({"completed", "failed", "timeout"})


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Columns aligned on two spaces, headers in capitals (as kubectl and gh print); ``-`` for none."""
    cells = [[str(h).upper() for h in headers]] + [["-" if c is None or c == "" else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells)


def job_rows(jobs: list[dict[str, Any]]) -> list[list[Any]]:
    """The jobs table's rows."""
    return [[j["job_id"], j.get("cluster"), status_of(j), j.get("stage"), j.get("job_name"), j.get("updated_at"),
             j.get("message")] for j in jobs]


JOB_HEADERS = ("job", "cluster", "status", "stage", "name", "updated", "message")


def status_of(job: dict[str, Any]) -> str:
    """The status, with the exit code of a job that ended with one."""
    status = str(job.get("status"))
    return f"{status} ({job['exit_code']})" if job.get("exit_code") is not None and status in FINISHED else status


def parse_time(value: str | None) -> dt.datetime | None:
    """An API timestamp (``...Z``) as an aware datetime."""
    return None if not value else dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


def duration(seconds: float) -> str:
    """``45s``, ``3m05s``, ``2h01m``, ``3d04h``: short and exact enough to compare at a glance."""
    seconds = int(max(seconds, 0))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def job_detail(job: dict[str, Any]) -> str:
    """A job as ``show`` prints it: its facts, its metadata, and its timeline with the time between events."""
    facts = [("Job", job["job_id"]), ("Name", job.get("job_name")), ("Cluster", job.get("cluster")),
             ("Status", status_of(job)), ("Stage", job.get("stage")), ("Message", job.get("message")),
             ("Submitted", job.get("submitted_at")), ("Started", job.get("started_at")),
             ("Completed", job.get("completed_at")), ("Updated", job.get("updated_at")),
             ("Recipe", job.get("recipe")), ("Logs", job.get("logs_url"))]
    width = max(len(name) for name, _ in facts) + 3  # two spaces after the longest "Name:"
    lines = [f"{name + ':':<{width}}{'-' if value is None else value}" for name, value in facts]
    if job.get("metadata"):
        lines += ["", "Metadata:"] + ["  " + line for line in json.dumps(job["metadata"], indent=2).splitlines()]
    events = job.get("events") or []
    lines += ["", "Events:"]
    rows, previous = [], None
    for event in events:
        at = parse_time(event.get("created_at"))
        since = "" if previous is None or at is None else "+" + duration((at - previous).total_seconds())
        rows.append([event["id"], event.get("created_at"), since, event.get("status"), event.get("stage"),
                     event.get("message")])
        previous = at or previous
    lines += ["  " + line for line in table(("id", "time", "since", "status", "stage", "message"), rows).splitlines()]
    return "\n".join(lines)


def event_line(event: dict[str, Any]) -> str:
    """One event on one line: id, time, cluster/job, status, stage, message (tab-separated for cut and awk)."""
    who = f"{event['cluster']}/{event['job_id']}" if event.get("cluster") else str(event["job_id"])
    return "\t".join(str(v) for v in (event["id"], event.get("created_at"), who, event.get("status"),
                                      event.get("stage") or "-", event.get("message") or ""))
