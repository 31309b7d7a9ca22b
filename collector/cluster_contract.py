"""The cluster side of the API: probe reports in, cluster health and active jobs out.

Not part of the Status API v1 (collector/contract.py): srtctl never calls these
routes. ``collector probe`` sends ClusterStatusReport; GET /api/clusters and
/api/clusters/stream answer with ClusterState.
"""

from __future__ import annotations

import enum
from typing import Annotated

from pydantic import BaseModel
from pydantic import Field

from collector.contract import MAX_ID_LENGTH
from collector.contract import Identifier
from collector.contract import OptionalText
from collector.contract import OutTimestamp
from collector.contract import Timestamp
from collector.contract import _Payload

# A cluster of 100,000 nodes still fits: the body limit (1 MiB) is the real bound.
MAX_ITEMS = 100_000
Name = Annotated[str, Field(min_length=1, max_length=MAX_ID_LENGTH)]
State = Annotated[str, Field(min_length=1, max_length=64)]


class Health(str, enum.Enum):  # noqa: UP042 - StrEnum would change str() and f-strings of a member
    """A cluster's health, by the rules of collector/health.py."""

    AVAILABLE = "available"
    DEGRADED = "degraded"
    UNAVAILABLE = "unavailable"


class Phase(str, enum.Enum):  # noqa: UP042 - StrEnum would change str() and f-strings of a member
    """Where an active job is: not yet seen by Slurm, waiting in its queue, or running."""

    PREPARING = "preparing"
    QUEUED = "queued"
    RUNNING = "running"


class NodeReport(_Payload):
    """One node as ``sinfo -N`` shows it: state verbatim (flags included), reason or null."""

    name: Name
    state: State
    reason: OptionalText = None


class PartitionReport(_Payload):
    """One partition and its availability (``sinfo`` ``%a``: up, down, drain, inact)."""

    name: Name
    state: State


class SlurmJobReport(_Payload):
    """One line of ``squeue -t all`` for a watched job."""

    job_id: Identifier
    state: Annotated[str, Field(min_length=1, max_length=32)]
    reason: OptionalText = None


class ClusterStatusReport(_Payload):
    """Body of ``PUT /api/clusters/{cluster}/status``: what one probe of the cluster saw."""

    probed_at: Timestamp
    interval_s: Annotated[float, Field(ge=1, le=86_400)] = 30.0
    error: Annotated[str | None, Field(max_length=64 * 1024)] = None
    nodes: Annotated[list[NodeReport], Field(max_length=MAX_ITEMS)] = []
    partitions: Annotated[list[PartitionReport], Field(max_length=MAX_ITEMS)] = []
    jobs: Annotated[list[SlurmJobReport], Field(max_length=MAX_ITEMS)] = []
    queried_job_ids: Annotated[list[Identifier], Field(max_length=MAX_ITEMS)] = []


class ActiveJob(BaseModel):
    """A job of the cluster that is not finished, and its phase."""

    job_id: str
    job_name: str
    status: str
    phase: Phase
    # Slurm's reason while queued (Resources, Priority, ...), else null.
    reason: str | None = None
    # About when the phase began.
    since: OutTimestamp
    # Slurm's own state as the probe last saw it (null: never seen).
    slurm_state: str | None = None


class ClusterState(BaseModel):
    """One cluster: its jobs by status, its health from the newest probe, and its active jobs.

    ``cluster`` null gathers the jobs whose cluster is not known yet. ``status``,
    ``detail`` and ``probed_at`` are null for a cluster no probe ever reported; a probe
    that stopped reporting makes ``probe_silent`` true and the status unavailable.
    """

    cluster: str | None
    total: int
    statuses: dict[str, int]
    status: Health | None = None
    detail: str | None = None
    probed_at: OutTimestamp | None = None
    probe_silent: bool = False
    active_jobs: list[ActiveJob] = []


class ClusterListResponse(BaseModel):
    """``GET /api/clusters``: every cluster that holds a job or was probed, by name."""

    clusters: list[ClusterState]


class ClusterStatusResponse(ClusterState):
    """A probe's answer: the cluster as now known, and the job ids to ask Slurm about next."""

    watch: list[str]

