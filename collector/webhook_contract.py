"""Webhook subscriptions on the wire: what ``POST /api/webhooks`` takes and what the routes answer.

Not part of the Status API v1 (collector/contract.py): srtctl never calls these routes.
An admin (or the spec's write token) subscribes a URL to job events by status and
cluster; the secret, when set, signs each delivery and is never shown again.
"""

from __future__ import annotations

import enum
from typing import Annotated
from typing import TypeVar
from urllib.parse import urlsplit

from pydantic import AfterValidator
from pydantic import BaseModel
from pydantic import ConfigDict
from pydantic import Field

from collector.contract import Identifier
from collector.contract import JobStatus
from collector.contract import OutTimestamp

MAX_URL = 2048
MAX_SECRET = 256
MAX_ITEMS = 1000
# What people want to hear about by default: a job that ended, however it ended.
FINISHED = (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.TIMEOUT)


class Format(str, enum.Enum):  # noqa: UP042 - StrEnum would change str() and f-strings of a member
    """How a delivery's body looks: the collector's JSON, or a Slack incoming-webhook message."""

    JSON = "json"
    SLACK = "slack"


def _http_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"must be an http:// or https:// URL, not {parts.scheme or 'one without a scheme'}")
    if not parts.hostname:
        raise ValueError("must name a host")
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        raise ValueError("must not hold whitespace or control characters")
    return url


HttpUrl = Annotated[str, Field(min_length=1, max_length=MAX_URL), AfterValidator(_http_url)]


T = TypeVar("T")


def _distinct(values: list[T]) -> list[T]:
    return list(dict.fromkeys(values))


class WebhookCreate(BaseModel):
    """``POST /api/webhooks``: where to send which events, signed with ``secret`` when one is given."""

    model_config = ConfigDict(extra="forbid")

    url: HttpUrl
    statuses: Annotated[list[JobStatus], Field(min_length=1, max_length=MAX_ITEMS), AfterValidator(_distinct)] = list(
        FINISHED)
    clusters: Annotated[list[Identifier], Field(max_length=MAX_ITEMS), AfterValidator(_distinct)] = []
    secret: Annotated[str, Field(min_length=1, max_length=MAX_SECRET)] | None = None
    format: Format = Format.JSON


class Webhook(BaseModel):
    """A subscription as the routes show it: never its secret, only whether it has one."""

    id: int
    url: str
    statuses: list[JobStatus]
    clusters: list[str] = Field(description="Empty: every cluster.")
    format: Format
    signed: bool = Field(description="Whether deliveries carry X-Collector-Signature (a secret is set).")
    enabled: bool
    disabled_reason: str | None
    created_at: OutTimestamp
    created_by: str | None = Field(description="The credential that added it; null on an open server or from the CLI.")


class WebhookList(BaseModel):
    """``GET /api/webhooks``: every subscription, oldest first."""

    webhooks: list[Webhook]


class DeliveryState(str, enum.Enum):  # noqa: UP042 - StrEnum would change str() and f-strings of a member
    """Where a delivery is: still to go (due, or waiting to retry), taken by the receiver, or given up."""

    PENDING = "pending"
    SENT = "sent"
    DEAD = "dead"


class JobDelivery(BaseModel):
    """One webhook delivery of one of the job's events: never the subscription's URL, nor the receiver's answer."""

    delivery_id: int
    webhook_id: int
    event_id: int
    event_status: JobStatus
    state: DeliveryState
    attempts: int
    last_status: int | None = Field(description="The HTTP status of the newest try; null before one, or no answer.")
    created_at: OutTimestamp
    next_attempt_at: OutTimestamp | None = Field(description="When a pending delivery is due next; null otherwise.")
    sent_at: OutTimestamp | None


class JobDeliveryList(BaseModel):
    """``GET /api/jobs/{job_id}/deliveries``: the webhook deliveries of the job's events, oldest first."""

    job_id: str
    cluster: str | None
    deliveries: list[JobDelivery]
