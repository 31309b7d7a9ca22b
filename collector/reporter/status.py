"""StatusReporter: srtctl's create and update calls for one job, to every endpoint, never raising."""

from __future__ import annotations

import datetime as dt
import socket
from typing import Any

from collector.reporter.transport import Transport

COMPLETED_MESSAGE = "Benchmark completed successfully"
# collector.contract's JobStatus and JobStage, spelled out: the reporter does not import the
# server's models (pydantic); tests/test_reporter.py keeps the two equal.
STATUSES = ("submitted", "starting", "workers", "frontend", "benchmark", "completed", "failed", "timeout")
STAGES = ("starting", "head_infrastructure", "preflight", "workers", "frontend", "benchmark", "cleanup")


def now() -> str:
    """The current UTC time as the reporter sends it: ISO 8601 with ``Z``."""
    return dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z")


def failed_message(exit_code: int) -> str:
    """The message srtctl sends with a nonzero exit code."""
    return f"Job failed with exit code {exit_code}"


class StatusReporter:
    """Lifecycle reports for one job: ``create`` (POST, exactly 201) and ``report*`` (PUT, exactly 200)."""

    def __init__(self, transport: Transport, job_id: str, *, cluster: str | None = None) -> None:
        self.transport = transport
        self.job_id = str(job_id)
        self.cluster = cluster or None

    def create(self, job_name: str, *, recipe: str | None = None, metadata: dict[str, Any] | None = None,
               submitted_at: str | None = None) -> bool:
        """Register the job (srtctl's create_job_record); True when every endpoint answered 201."""
        payload = dict(job_id=self.job_id, job_name=job_name, submitted_at=submitted_at or now(),
                       cluster=self.cluster, recipe=recipe, metadata=metadata)
        return self._send("POST", "/api/jobs", payload, 201)

    def report(self, status: str, stage: str | None = None, message: str | None = None, **fields: Any) -> bool:
        """One status update; top-level None fields are left out; True when every endpoint answered 200."""
        payload = dict(status=status, updated_at=fields.pop("updated_at", None) or now(), stage=stage,
                       message=message, **fields)
        if self.cluster:
            # Every update repeats the cluster, so a lost POST still leaves the job's identity.
            payload["metadata"] = {"cluster": self.cluster, **(payload.get("metadata") or {})}
        # The job id goes into the path as is, like srtctl (requests only escapes what a URL cannot hold).
        return self._send("PUT", f"/api/jobs/{self.job_id}", payload, 200)

    def report_started(self, *, job_name: str | None = None, head_node: str | None = None,
                       log_dir: str | None = None, metadata: dict[str, Any] | None = None) -> bool:
        """``starting``/``starting`` "Job started on <head>" with started_at and the identity metadata."""
        head = head_node or socket.gethostname()
        started = {**(metadata or {}), "job_name": job_name, "cluster": self.cluster, "head_node": head,
                   "log_dir": log_dir}
        stamp = now()
        return self.report("starting", "starting", f"Job started on {head}", started_at=stamp, updated_at=stamp,
                           metadata=started)

    def report_completed(self, exit_code: int, *, logs_url: str | None = None, message: str | None = None,
                         stage: str = "cleanup") -> bool:
        """``completed`` "Benchmark completed successfully" for 0, else ``failed`` "Job failed with exit code N"."""
        ok = exit_code == 0
        stamp = now()
        return self.report(
            "completed" if ok else "failed",
            stage,
            message or (COMPLETED_MESSAGE if ok else failed_message(exit_code)),
            completed_at=stamp,
            updated_at=stamp,
            exit_code=exit_code,
            logs_url=logs_url,
        )

    def _send(self, method: str, path: str, payload: dict[str, Any], ok: int) -> bool:
        body = {k: v for k, v in payload.items() if v is not None}
        outcomes = self.transport.send(method, path, json=body, ok=(ok,))
        return bool(outcomes) and all(o.ok for o in outcomes)
