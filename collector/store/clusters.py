"""Clusters: probe reports, what Slurm says of each active job, and the clusters' state for readers."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection
from sqlalchemy import RowMapping
from sqlalchemy import case
from sqlalchemy import desc
from sqlalchemy import select

from collector.cluster_contract import ActiveJob
from collector.cluster_contract import ClusterState
from collector.cluster_contract import ClusterStatusReport
from collector.cluster_contract import Health
from collector.cluster_contract import Phase
from collector.cluster_contract import SlurmJobReport
from collector.contract import JobStatus
from collector.contract import SlurmView
from collector.contract import format_timestamp
from collector.models import ClusterProbe
from collector.models import SlurmJob
from collector.store import counts
from collector.store.core import table
from collector.store.core import upsert
from collector.store.identity import JOBS
from collector.store.identity import NO_CLUSTER
from collector.store.identity import wire_cluster

PROBES = table(ClusterProbe)
SLURM = table(SlurmJob)
FINISHED = frozenset({JobStatus.COMPLETED.value, JobStatus.FAILED.value, JobStatus.TIMEOUT.value})
ACTIVE = tuple(status.value for status in JobStatus if status.value not in FINISHED)
# Slurm job states after which the job is out of the queue for good (squeue -t all
# keeps listing them for MinJobAge seconds).
SLURM_FINISHED = frozenset({
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
    "PREEMPTED", "REVOKED", "SPECIAL_EXIT", "TIMEOUT",
})
# Waiting to run; everything else that is not finished counts as running.
SLURM_WAITING = frozenset({"PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD"})
# Active jobs listed per cluster (newest first); the counts stay exact beyond it.
ACTIVE_LISTED = 200
# SQLite's bound-parameter limit is far above this; it keeps IN lists of any size safe.
_ID_BATCH = 500


def silent_after(interval_s: float) -> dt.timedelta:
    """How long after a report the next one is overdue: three missed probes and some slack."""
    return dt.timedelta(seconds=3 * interval_s + 5)


def save_probe(conn: Connection, cluster: str, report: ClusterStatusReport, health: Health, detail: str | None,
               now: dt.datetime) -> None:
    """Store ``report`` as ``cluster``'s newest probe, with the health derived from it."""
    row = {
        "cluster": cluster,
        "status": health.value,
        "detail": detail,
        "probed_at": report.probed_at,
        "received_at": now,
        "interval_s": report.interval_s,
        "status_since": now,
        "report": report.model_dump(mode="json", include={"error", "nodes", "partitions"}),
    }
    upsert(conn, PROBES, [row], ["cluster"], {
        **{name: (lambda excluded, name=name: excluded[name])
           for name in row if name not in ("cluster", "status_since")},
        # Only a change of status restarts its clock.
        "status_since": lambda excluded: case((PROBES.c.status == excluded.status, PROBES.c.status_since),
                                              else_=excluded.status_since),
    })


def observe_jobs(conn: Connection, cluster: str, report: ClusterStatusReport, now: dt.datetime) -> None:
    """Record what Slurm said of the cluster's active jobs the probe asked about."""
    listed = {job.job_id: job for job in report.jobs}
    asked = sorted(set(report.queried_job_ids) | set(listed))
    rows = []
    for batch in _batches(asked):
        query = (
            select(JOBS.c.id, JOBS.c.job_id, JOBS.c.submitted_at, JOBS.c.started_at, SLURM.c.state,
                   SLURM.c.state_since, SLURM.c.gone_since)
            .outerjoin(SLURM, SLURM.c.job_pk == JOBS.c.id)
            .where(JOBS.c.cluster == cluster, JOBS.c.status.in_(ACTIVE), JOBS.c.job_id.in_(batch))
        )
        for job in conn.execute(query).mappings():
            rows.append(_observation(job, listed.get(job["job_id"]), now))
    if rows:
        upsert(conn, SLURM, rows, ["job_pk"], {
            name: (lambda excluded, name=name: excluded[name]) for name in rows[0] if name != "job_pk"
        })


def _observation(job: RowMapping, seen: SlurmJobReport | None, now: dt.datetime) -> dict[str, Any]:
    """The slurm_jobs row for one asked-about job: ``seen`` is its squeue line, None when Slurm lacks it."""
    if seen is None:
        # Keep the last state Slurm showed: "last seen RUNNING" is what people need to read.
        state, reason, out = job["state"], None, True
    else:
        state = seen.state.upper()
        reason = seen.reason if state in SLURM_WAITING else None
        out = state in SLURM_FINISHED
    since = job["state_since"]
    if state != job["state"] or since is None:
        if job["state"] is None and state in SLURM_WAITING:
            since = job["submitted_at"]  # first seen waiting: it has waited since submission
        elif job["state"] is None and job["started_at"] is not None and state is not None:
            since = min(job["started_at"], now)
        else:
            since = now if state is not None else None
    return {
        "job_pk": job["id"],
        "state": state,
        "reason": reason,
        "state_since": since,
        "gone_since": (job["gone_since"] or now) if out else None,
        "observed_at": now,
    }


def _batches(items: list[str]) -> Iterable[list[str]]:
    for start in range(0, len(items), _ID_BATCH):
        yield items[start:start + _ID_BATCH]


def watch(conn: Connection, cluster: str, limit: int = 10_000) -> list[str]:
    """The ids of ``cluster``'s active jobs, newest first: what the probe asks Slurm about."""
    query = (
        select(JOBS.c.job_id)
        .where(JOBS.c.cluster == cluster, JOBS.c.status.in_(ACTIVE))
        .order_by(desc(JOBS.c.submitted_at), desc(JOBS.c.id))
        .limit(limit)
    )
    return list(conn.scalars(query))


def slurm_of(row: dict[str, Any]) -> SlurmView:
    """What the probe last saw of one job: the view of its ``slurm_jobs`` row."""
    return SlurmView(state=row["state"], reason=row["reason"], since=row["state_since"],
                     observed_at=row["observed_at"], gone_since=row["gone_since"])


@dataclasses.dataclass(frozen=True)
class _Probe:
    status: str
    detail: str | None
    probed_at: dt.datetime
    received_at: dt.datetime
    interval_s: float


def states(conn: Connection, now: dt.datetime, cluster: str | None = None) -> list[ClusterState]:
    """Every cluster that holds a job or was probed (or just ``cluster``), by name, cluster-less jobs last."""
    found = counts.by_cluster(conn)
    probe_query = select(PROBES.c.cluster, PROBES.c.status, PROBES.c.detail, PROBES.c.probed_at,
                         PROBES.c.received_at, PROBES.c.interval_s)
    if cluster is not None:
        probe_query = probe_query.where(PROBES.c.cluster == cluster)
        found = {cluster: found.get(cluster, {})}
    probes = {row.cluster: _Probe(*row[1:]) for row in conn.execute(probe_query)}
    names = sorted(set(found) | set(probes), key=lambda name: (name == NO_CLUSTER, name))
    return [_state(conn, name, found.get(name, {}), probes.get(name), now) for name in names]


def health(conn: Connection, now: dt.datetime) -> list[tuple[str, str, float]]:
    """Each probed cluster's status now (unavailable once its probe is silent) and its report's age in seconds."""
    rows = conn.execute(select(PROBES.c.cluster, PROBES.c.status, PROBES.c.received_at, PROBES.c.interval_s))
    found = []
    for cluster, status, received_at, interval_s in rows:
        silent = now - received_at > silent_after(interval_s)
        found.append((cluster, Health.UNAVAILABLE.value if silent else status, (now - received_at).total_seconds()))
    return found


def _state(conn: Connection, name: str, statuses: dict[str, int], probe: _Probe | None,
           now: dt.datetime) -> ClusterState:
    active = _active_jobs(conn, name) if any(statuses.get(s) for s in ACTIVE) else []
    state = ClusterState(cluster=wire_cluster(name), total=sum(statuses.values()),
                         statuses=_in_lifecycle_order(statuses), active_jobs=active)
    if probe is None:
        return state
    state.status, state.detail, state.probed_at = Health(probe.status), probe.detail, probe.probed_at
    if now - probe.received_at > silent_after(probe.interval_s):
        # The last report says nothing about now: the cluster (or its probe) may be gone.
        last = f"{probe.status}: {probe.detail}" if probe.detail else probe.status
        state.status, state.probe_silent = Health.UNAVAILABLE, True
        state.detail = (f"probe silent since {format_timestamp(probe.received_at)} "
                        f"(expected every {probe.interval_s:g} s); last report: {last}")
    return state


_LIFECYCLE = [status.value for status in JobStatus]


def _in_lifecycle_order(statuses: dict[str, int]) -> dict[str, int]:
    known = {status: statuses[status] for status in _LIFECYCLE if status in statuses}
    return {**known, **{status: n for status, n in sorted(statuses.items()) if status not in known}}


def _active_jobs(conn: Connection, cluster: str) -> list[ActiveJob]:
    query = (
        select(JOBS.c.job_id, JOBS.c.job_name, JOBS.c.status, JOBS.c.submitted_at, JOBS.c.started_at,
               SLURM.c.state, SLURM.c.reason, SLURM.c.state_since)
        .outerjoin(SLURM, SLURM.c.job_pk == JOBS.c.id)
        .where(JOBS.c.cluster == cluster, JOBS.c.status.in_(ACTIVE))
        .order_by(desc(JOBS.c.submitted_at), desc(JOBS.c.id))
        .limit(ACTIVE_LISTED)
    )
    return [_active(row) for row in conn.execute(query).mappings()]


def _active(row: RowMapping) -> ActiveJob:
    state = row["state"]
    if state in SLURM_WAITING:
        phase, since = Phase.QUEUED, row["state_since"] or row["submitted_at"]
    elif state is not None and state not in SLURM_FINISHED:
        phase, since = Phase.RUNNING, row["state_since"] or row["started_at"] or row["submitted_at"]
    elif row["status"] == JobStatus.SUBMITTED.value:
        # Reported but not (or no longer) seen in Slurm's queue, and not started.
        phase, since = Phase.PREPARING, row["submitted_at"]
    else:
        phase, since = Phase.RUNNING, row["started_at"] or row["submitted_at"]
    return ActiveJob(job_id=row["job_id"], job_name=row["job_name"], status=row["status"], phase=phase,
                     reason=row["reason"] if phase is Phase.QUEUED else None, since=since, slurm_state=state)
