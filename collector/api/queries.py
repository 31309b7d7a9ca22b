"""Query-string models shared by the job and event views."""

from __future__ import annotations

import enum
from typing import Annotated

from pydantic import AfterValidator
from pydantic import BaseModel
from pydantic import ConfigDict
from pydantic import Field

from collector.contract import MAX_ID_LENGTH
from collector.contract import BlobName
from collector.contract import JobStatus
from collector.contract import Offset

MAX_PER_PAGE = 100
MAX_EVENT_LIMIT = 1000
MAX_CURSOR = 2**63 - 1
MAX_SEARCH_LENGTH = 200


def _blank_is_none(value: str | None) -> str | None:
    return value if value else None


def _trimmed(value: str | None) -> str | None:
    # A pasted search often carries a stray space; blank means no search at all.
    return value.strip() or None if value else None


# ``?cluster=`` (empty) means "no cluster given", as if the parameter were absent.
# No NUL: PostgreSQL cannot compare text with one, so it would be a database error, not a 422.
_NO_NUL = r"^[^\x00]*$"
ClusterArg = Annotated[
    str | None, Field(default=None, max_length=MAX_ID_LENGTH, pattern=_NO_NUL), AfterValidator(_blank_is_none)
]

JobIdArg = ClusterArg  # the same rule: optional, blank means absent, no NUL
Cursor = Annotated[int, Field(ge=0, le=MAX_CURSOR)]


class _Query(BaseModel):
    # Unknown parameters are ignored, like every web API the dashboards already talk to.
    model_config = ConfigDict(extra="ignore")


class ClusterQuery(_Query):
    """``?cluster=`` on routes that address one job."""

    cluster: ClusterArg = None


class JobSort(str, enum.Enum):  # noqa: UP042 - StrEnum would change str() and f-strings of a member
    """What ``GET /api/jobs`` can be ordered by."""

    SUBMITTED = "submitted"
    UPDATED = "updated"
    JOB_ID = "job_id"
    STATUS = "status"
    CLUSTER = "cluster"


class SortOrder(str, enum.Enum):  # noqa: UP042 - StrEnum would change str() and f-strings of a member
    ASC = "asc"
    DESC = "desc"


# Times read newest first unless told otherwise; names and statuses read A to Z.
DEFAULT_ORDER = {JobSort.SUBMITTED: SortOrder.DESC, JobSort.UPDATED: SortOrder.DESC}


class JobListQuery(_Query):
    """``GET /api/jobs``; a ``page`` or ``per_page`` out of range is 422, never clamped."""

    # Bounded so the OFFSET it becomes always fits a BIGINT.
    page: Annotated[int, Field(ge=1, le=10_000_000)] = 1
    # The spec's maximum, refused like the built-in collector refuses it: dashboards written
    # against it expect a 422, and a clamped page would look like the last one.
    per_page: Annotated[int, Field(ge=1, le=MAX_PER_PAGE)] = 50
    status: JobStatus | None = None
    cluster: ClusterArg = None
    q: Annotated[
        str | None,
        Field(default=None, max_length=MAX_SEARCH_LENGTH, pattern=_NO_NUL,
              description="case-insensitive substring of the job id, name, recipe or a tag"),
        AfterValidator(_trimmed),
    ] = None
    sort: Annotated[JobSort, Field(description="what the list is ordered by")] = (
        JobSort.SUBMITTED)
    order: Annotated[
        SortOrder | None, Field(description="default: desc for submitted and updated, asc for the others")
    ] = None

    @property
    def descending(self) -> bool:
        return (self.order or DEFAULT_ORDER.get(self.sort, SortOrder.ASC)) is SortOrder.DESC


class EventQuery(_Query):
    """Cursor parameters of both feeds; a ``limit`` out of range is 422, never clamped."""

    after: Cursor = 0
    # The spec's maximum (as ``per_page``): a poller that asked for more must not take a
    # shorter page for the end of the feed.
    limit: Annotated[int, Field(ge=1, le=MAX_EVENT_LIMIT)] = 100
    cluster: ClusterArg = None


class FeedQuery(EventQuery):
    """``GET /api/events``: the cursor plus job and cluster filters."""

    job_id: JobIdArg = None


class JobStreamQuery(ClusterQuery):
    """``GET /api/jobs/{id}/events/stream``: where to resume, and which statuses to send."""

    after: Cursor | None = None
    status: JobStatus | None = None


class StreamQuery(JobStreamQuery):
    """``GET /api/events/stream``: the job stream's parameters plus a job id filter."""

    job_id: JobIdArg = None


class LogUploadQuery(ClusterQuery):
    """``POST /api/jobs/{id}/logs`` with a raw body."""

    file: BlobName
    offset: Offset
    final: bool = False


class BlobReadQuery(ClusterQuery):
    """``GET`` of a job's logs or captures: the listing without ``file``, else that file."""

    file: BlobName | None = None
    offset: Offset = 0


class CaptureUploadQuery(ClusterQuery):
    """``POST /api/jobs/{id}/captures``: one sequential chunk of a fixed-size segment."""

    file: BlobName
    offset: Offset
    total: Offset
