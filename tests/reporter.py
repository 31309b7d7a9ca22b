"""What an unmodified srtctl reporter sends, request for request (see DESIGN.md).

Kept in the tests so the suite checks the collector against the client's real
behaviour: JSON bodies built with exclude_none, 5 s timeout, redirects never
followed, the job id unquoted in the path, success only on exactly 201 / 200.
"""

from __future__ import annotations

import datetime as dt

import requests

STARTED_METADATA = {
    "model": {"path": "/models/deepseek-r1", "precision": "fp8"},
    "resources": {
        "gpu_type": "b200",
        "gpus_per_node": 8,
        "prefill_workers": 1,
        "decode_workers": 4,
        "agg_workers": None,
        "cpu_allocation": "0-143",
        "cpu_check": "ok",
    },
    "benchmark": {"type": "sa-bench"},
    "backend_type": "sglang",
    "frontend_type": "dynamo",
    "head_node": "node-01",
    "log_dir": "/lustre/outputs/12345/logs/12345_1P_4D",
}


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z")


class Reporter:
    """The srtctl StatusReporter and create_job_record for one job and one endpoint."""

    def __init__(self, endpoint: str, job_id: str, token: str | None = None) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.job_id = job_id
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def _send(self, method: str, url: str, payload: dict, ok: int) -> bool:
        body = {k: v for k, v in payload.items() if v is not None}
        response = requests.request(method, url, json=body, headers=self.headers, timeout=5.0, allow_redirects=False)
        return response.status_code == ok

    def create(self, job_name: str, *, cluster=None, recipe=None, metadata=None, submitted_at=None) -> bool:
        payload = dict(job_id=self.job_id, job_name=job_name, submitted_at=submitted_at or now(),
                       cluster=cluster, recipe=recipe, metadata=metadata)
        return self._send("POST", f"{self.endpoint}/api/jobs", payload, 201)

    def report(self, status: str, stage: str | None = None, message: str | None = None, **extra) -> bool:
        payload = dict(status=status, updated_at=extra.pop("updated_at", None) or now(), stage=stage,
                       message=message, **extra)
        return self._send("PUT", f"{self.endpoint}/api/jobs/{self.job_id}", payload, 200)

    def report_started(self, *, job_name: str | None, cluster: str | None, head: str = "node-01") -> bool:
        metadata = {**STARTED_METADATA, "head_node": head, "job_name": job_name, "cluster": cluster}
        stamp = now()
        return self.report("starting", "starting", f"Job started on {head}", started_at=stamp,
                           updated_at=stamp, metadata=metadata)

    def report_completed(self, exit_code: int, logs_url: str | None = None) -> bool:
        ok = exit_code == 0
        stamp = now()
        return self.report(
            "completed" if ok else "failed",
            "cleanup",
            "Benchmark completed successfully" if ok else f"Job failed with exit code {exit_code}",
            completed_at=stamp,
            updated_at=stamp,
            exit_code=exit_code,
            logs_url=logs_url,
        )

    def report_artifacts(self, logs_url: str) -> bool:
        return self.report("benchmark", "cleanup", "Artifacts uploaded", logs_url=logs_url)

    def run_lifecycle(self, *, job_name: str, cluster: str | None, exit_code: int = 0) -> list[bool]:
        """Every report a successful sweep sends, in order."""
        return [
            self.report_started(job_name=job_name, cluster=cluster),
            self.report("starting", "head_infrastructure", "Starting head infrastructure"),
            self.report("workers", "workers", "Starting workers"),
            self.report("frontend", "frontend", "Starting frontend"),
            self.report("frontend", "frontend", "Inference endpoint ready"),
            self.report("benchmark", "benchmark", "Running benchmark"),
            self.report_artifacts(f"s3://bucket/outputs/{self.job_id}/"),
            self.report_completed(exit_code, logs_url=f"s3://bucket/outputs/{self.job_id}/"),
        ]
