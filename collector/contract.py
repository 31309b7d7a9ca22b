"""Status API v1 wire models (the names of ``srtctl.contract``), plus ``cluster`` everywhere."""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Iterable
from typing import Annotated
from typing import Any

from pydantic import AfterValidator
from pydantic import BaseModel
from pydantic import BeforeValidator
from pydantic import ConfigDict
from pydantic import Field
from pydantic import PlainSerializer
from pydantic import TypeAdapter
from pydantic import ValidationError
from pydantic import ValidationInfo
from pydantic import field_validator
from pydantic import model_validator
from pydantic_core import PydanticCustomError

MAX_ID_LENGTH = 255


# Not StrEnum: str() and f-strings of a (str, Enum) member give "JobStatus.FAILED", of a StrEnum
# member the value; keeping the base keeps every text that formats a member as it is.
class JobStatus(str, enum.Enum):  # noqa: UP042
    """The stage a job is executing (entered, not finished)."""

    SUBMITTED = "submitted"
    STARTING = "starting"
    WORKERS = "workers"
    FRONTEND = "frontend"
    BENCHMARK = "benchmark"
    COMPLETED = "completed"
    FAILED = "failed"
    TIMEOUT = "timeout"


class JobStage(str, enum.Enum):  # noqa: UP042 - as JobStatus: StrEnum would change str() of a member
    """Execution stages of an srtctl sweep."""

    STARTING = "starting"
    HEAD_INFRASTRUCTURE = "head_infrastructure"
    PREFLIGHT = "preflight"
    WORKERS = "workers"
    FRONTEND = "frontend"
    BENCHMARK = "benchmark"
    CLEANUP = "cleanup"


def format_timestamp(value: dt.datetime) -> str:
    """Render a UTC timestamp the way the reporter sends them: ISO 8601 with ``Z``."""
    return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def parse_timestamp(value: Any) -> dt.datetime:
    """Parse an ISO 8601 string (``Z``, an offset, or naive meaning UTC) into aware UTC."""
    if isinstance(value, dt.datetime):
        parsed = value
    elif isinstance(value, str):
        try:
            parsed = dt.datetime.fromisoformat(value.strip())
        except ValueError:
            raise ValueError(f"not an ISO 8601 timestamp: {value[:64]!r}") from None
    else:
        raise ValueError("must be an ISO 8601 timestamp string")
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return parsed.astimezone(dt.UTC)


Timestamp = Annotated[dt.datetime, BeforeValidator(parse_timestamp), PlainSerializer(format_timestamp)]
OutTimestamp = Annotated[dt.datetime, PlainSerializer(format_timestamp)]
Identifier = Annotated[str, Field(min_length=1, max_length=MAX_ID_LENGTH, pattern=r"^[^\x00-\x1f\x7f/]+$")]
OptionalText = Annotated[str | None, Field(default=None, max_length=MAX_ID_LENGTH * 16)]


def _strip_blank(value: Any) -> Any:
    if isinstance(value, str):
        return value.strip() or None
    return value


# A cluster name as both POST (``cluster``) and PUT (``metadata.cluster``) carry it:
# surrounding blanks dropped, blank meaning "no cluster", as long as the column holds.
ClusterName = Annotated[Annotated[str, Field(max_length=MAX_ID_LENGTH)] | None, BeforeValidator(_strip_blank)]
_CLUSTER_NAME: TypeAdapter[str | None] = TypeAdapter(ClusterName)
# PostgreSQL's INTEGER: a larger exit code would be a database error, not a 422.
ExitCode = Annotated[int, Field(ge=-(2**31), le=2**31 - 1)]


def _unstorable(text: str) -> str | None:
    """What keeps ``text`` out of the database, if anything: a NUL, or a lone surrogate."""
    if "\x00" in text:
        return "a NUL (\\u0000) character"
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:
            return "a lone surrogate (\\ud800-\\udfff), which has no UTF-8 form"
    return None


def _unstorable_path(value: Any, path: tuple[object, ...]) -> tuple[tuple[object, ...], str] | None:
    """Where text the database refuses hides in a JSON value, and what it is.

    PostgreSQL text and jsonb refuse NUL; neither database can store a lone surrogate
    (a JSON escape such as \\ud800 with no partner), which has no UTF-8 form.
    """
    if isinstance(value, str):
        what = _unstorable(value)
        return (path, what) if what else None
    items: Iterable[tuple[object, object]]
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = _unstorable_path(key, path + (key,)) if isinstance(key, str) else None
        found = found or _unstorable_path(item, path + (key,))
        if found:
            return found
    return None


# Validation context key: the caller has seen the raw JSON and it cannot hold a NUL or a
# lone surrogate (api.parse_body), so the walk over every value is skipped.
TEXT_CHECKED = "text_checked"


class _Payload(BaseModel):
    # Reporters newer than us may send fields we do not know: accept and ignore them.
    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _storable_text(cls, data: Any, info: ValidationInfo) -> Any:
        if info.context and info.context.get(TEXT_CHECKED):
            return data
        found = _unstorable_path(data, ())
        if found:
            path, what = found
            # A key may hold the surrogate itself: written as its escape, or the message has no UTF-8 form either.
            at = ".".join(str(part).encode("utf-8", "backslashreplace").decode() for part in path)
            raise PydanticCustomError("unstorable_text", "text may not contain {what}, found at {at}",
                                      {"what": what, "at": at})
        return data


class JobCreatePayload(_Payload):
    """Body of ``POST /api/jobs``."""

    job_id: Identifier
    job_name: Annotated[str, Field(min_length=1, max_length=4096)]
    submitted_at: Timestamp
    cluster: ClusterName = None
    recipe: OptionalText = None
    metadata: dict[str, Any] | None = None


class JobUpdatePayload(_Payload):
    """Body of ``PUT /api/jobs/{job_id}``; absent fields leave the stored value alone."""

    status: JobStatus
    updated_at: Timestamp
    stage: JobStage | None = None
    message: OptionalText = None
    started_at: Timestamp | None = None
    completed_at: Timestamp | None = None
    exit_code: ExitCode | None = None
    logs_url: OptionalText = None
    benchmark_results: dict[str, Any] | None = None
    artifacts: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None

    @field_validator("metadata")
    @classmethod
    def _reported_cluster_fits(cls, metadata: dict[str, Any] | None) -> dict[str, Any] | None:
        # metadata.cluster is an identity field, held to the same rule as POST's cluster.
        if metadata and metadata.get("cluster") is not None:
            try:
                _CLUSTER_NAME.validate_python(metadata["cluster"])
            except ValidationError as exc:
                raise ValueError(f"cluster: {exc.errors()[0]['msg']}") from None
        return metadata

    def reported_cluster(self) -> str | None:
        """The cluster the reporter repeats in ``metadata.cluster`` (None when absent or blank)."""
        return _CLUSTER_NAME.validate_python((self.metadata or {}).get("cluster"))


class ErrorResponse(BaseModel):
    """The envelope of every error; some errors add fields (``errors``, ``clusters``, ``file``...)."""

    model_config = ConfigDict(extra="allow")

    detail: str
    request_id: str | None = None
    errors: list[dict[str, Any]] | None = None


class HealthResponse(BaseModel):
    """``GET /api/health``."""

    status: str


class ReadyResponse(BaseModel):
    """``GET /api/ready``: 200 when the database answers at the schema this code needs, else 503."""

    status: str
    database: str
    revision: str | None


class JobResponse(BaseModel):
    """Response of POST and PUT."""

    job_id: str
    status: str
    cluster: str | None = None


class JobEventRecord(BaseModel):
    """One lifecycle event; ``id`` is the cursor for the incremental feeds."""

    id: int
    job_id: str
    cluster: str | None = None
    status: str
    stage: str | None = None
    message: str | None = None
    created_at: OutTimestamp
    # Who wrote it: a credential's name, "env:write" for the spec's token (docs/api.md, "Credentials").
    credential: str | None = None


class JobSummary(BaseModel):
    """One row of the job list."""

    job_id: str
    job_name: str
    status: str
    stage: str | None = None
    message: str | None = None
    cluster: str | None = None
    submitted_at: OutTimestamp
    started_at: OutTimestamp | None = None
    completed_at: OutTimestamp | None = None
    updated_at: OutTimestamp
    exit_code: int | None = None


class StreamEvent(JobEventRecord):
    """The data of one ``job-event`` on the streams: the event and its job as it is now."""

    job: JobSummary


class SlurmView(BaseModel):
    """A job's place in Slurm's queue as the cluster probe last saw it."""

    # PENDING, RUNNING, CANCELLED, ... (null: the probe asked, Slurm never listed it).
    state: str | None
    # Why a pending job waits (Resources, Priority, ...).
    reason: str | None
    since: OutTimestamp | None
    observed_at: OutTimestamp
    # The first probe that found the job out of the queue (stale detection counts from here).
    gone_since: OutTimestamp | None


class JobDetail(BaseModel):
    """A job with its full ordered event history."""

    job_id: str
    job_name: str
    status: str
    stage: str | None = None
    cluster: str | None = None
    recipe: str | None = None
    message: str | None = None
    submitted_at: OutTimestamp
    started_at: OutTimestamp | None = None
    completed_at: OutTimestamp | None = None
    updated_at: OutTimestamp
    exit_code: int | None = None
    logs_url: str | None = None
    benchmark_results: dict[str, Any] | None = None
    artifacts: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    events: list[JobEventRecord] = []
    # Only when a cluster probe reports on the job's cluster (docs/slurm.md).
    slurm: SlurmView | None = None


class JobListResponse(BaseModel):
    """A page of the job list."""

    jobs: list[JobSummary]
    # With ``q=``, counting stops at 10,000 matches: ``total_exact`` false, ``total`` a floor.
    total: int
    page: int
    per_page: int
    total_exact: bool = True


class JobEventListResponse(BaseModel):
    """``GET /api/jobs/{job_id}/events``."""

    job_id: str
    cluster: str | None = None
    events: list[JobEventRecord]
    next_cursor: int | None = None


class EventFeedResponse(BaseModel):
    """``GET /api/events``."""

    events: list[JobEventRecord]
    next_cursor: int | None = None


class DeleteResponse(BaseModel):
    """``DELETE /api/jobs/{job_id}``."""

    deleted: bool
    job_id: str
    cluster: str | None = None


MAX_BLOB_NAME = 4096
MAX_OFFSET = 2**63 - 1


def _safe_relative_path(value: str) -> str:
    # A name is a key, never opened as a path, but it is shown, downloaded and perhaps
    # written out by tools: only plain relative paths, the same on every platform.
    if "\\" in value:
        raise ValueError("file may not contain backslashes")
    if any(ord(ch) < 0x20 or ch == "\x7f" for ch in value):
        raise ValueError("file may not contain control characters (NUL, newline, ...)")
    if value.startswith("/"):
        raise ValueError("file must be a relative path, not absolute")
    for part in value.split("/"):
        if part in ("", ".", ".."):
            raise ValueError("file may not have empty, '.' or '..' path components")
    return value


BlobName = Annotated[str, Field(min_length=1, max_length=MAX_BLOB_NAME), AfterValidator(_safe_relative_path)]
Offset = Annotated[int, Field(ge=0, le=MAX_OFFSET)]


class LogUploadResponse(BaseModel):
    """``POST /api/jobs/{job_id}/logs``: ``stored`` is 0 for a resend that added nothing."""

    job_id: str
    stored: int


class LegacyLogChunk(_Payload):
    """One chunk of the legacy JSON log upload; ``data`` is text, ``size`` its UTF-8 length."""

    file: BlobName
    offset: Offset
    size: Annotated[int, Field(ge=0)]
    data: str

    @model_validator(mode="after")
    def _size_matches(self) -> LegacyLogChunk:
        if len(self.data.encode()) != self.size:
            raise ValueError(f"size {self.size} is not the UTF-8 length of data ({len(self.data.encode())} bytes)")
        return self


class LegacyLogMetadata(_Payload):
    cluster: ClusterName = None


class LegacyLogPayload(_Payload):
    """The legacy JSON form of a log upload."""

    chunks: list[LegacyLogChunk]
    metadata: LegacyLogMetadata | None = None


class LogFile(BaseModel):
    """A streamed log file: ``size`` is the bytes received contiguously from 0."""

    file: str
    size: int
    final: bool
    updated_at: OutTimestamp


class LogFileList(BaseModel):
    job_id: str
    cluster: str | None
    files: list[LogFile]


class LogContent(BaseModel):
    """Decoded text of a log from ``offset``; poll again from ``next_offset``."""

    job_id: str
    file: str
    offset: int
    next_offset: int
    data: str
    size: int
    final: bool


class CaptureUploadResponse(BaseModel):
    """``POST /api/jobs/{job_id}/captures``."""

    job_id: str
    next_offset: int
    complete: bool


class CaptureFile(BaseModel):
    file: str
    size: int
    complete: bool
    updated_at: OutTimestamp


class CaptureFileList(BaseModel):
    job_id: str
    cluster: str | None
    files: list[CaptureFile]
