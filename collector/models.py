"""The schema: typed SQLAlchemy models for jobs, their lifecycle events, streamed blobs and cluster probes."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import JSON
from sqlalchemy import BigInteger
from sqlalchemy import Boolean
from sqlalchemy import CheckConstraint
from sqlalchemy import DateTime
from sqlalchemy import Float
from sqlalchemy import ForeignKey
from sqlalchemy import Index
from sqlalchemy import Integer
from sqlalchemy import LargeBinary
from sqlalchemy import MetaData
from sqlalchemy import SmallInteger
from sqlalchemy import String
from sqlalchemy import Text
from sqlalchemy import UniqueConstraint
from sqlalchemy import false
from sqlalchemy import text
from sqlalchemy import true
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.orm import Mapped
from sqlalchemy.orm import mapped_column
from sqlalchemy.types import TypeDecorator

# Named constraints make migrations deterministic and reversible on every backend.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

JSONDocument = JSON().with_variant(JSONB(), "postgresql")
# SQLite only auto-increments an INTEGER PRIMARY KEY; PostgreSQL gets a real BIGINT.
EventId = BigInteger().with_variant(Integer(), "sqlite")


class UTCDateTime(TypeDecorator[dt.datetime]):
    """A timestamp column that only accepts aware datetimes and always returns UTC."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(dt.UTC)
        # SQLite keeps text; storing naive UTC keeps its ordering lexical and uniform.
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=dt.UTC)
        return value.astimezone(dt.UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Job(Base):
    """One Slurm job on one cluster; ``cluster`` is ``''`` while no cluster is known."""

    __tablename__ = "jobs"
    __table_args__ = (
        # NOT NULL + '' instead of NULL: NULLs never collide in a unique index, so a
        # nullable cluster would let concurrent writers create cluster-less twins.
        UniqueConstraint("cluster", "job_id"),
        Index("ix_jobs_job_id", "job_id"),
        # Newest-first listing, plain and filtered; btrees scan backwards for DESC.
        Index("ix_jobs_submitted_at_id", "submitted_at", "id"),
        Index("ix_jobs_status_submitted_at_id", "status", "submitted_at", "id"),
        Index("ix_jobs_cluster_submitted_at_id", "cluster", "submitted_at", "id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    cluster: Mapped[str] = mapped_column(String(255), server_default="")
    job_id: Mapped[str] = mapped_column(String(255))
    job_name: Mapped[str] = mapped_column(Text)
    # True until a POST has told us the job's real identity.
    is_placeholder: Mapped[bool] = mapped_column(Boolean, server_default=false())
    status: Mapped[str] = mapped_column(String(32))
    stage: Mapped[str | None] = mapped_column(String(64))
    message: Mapped[str | None] = mapped_column(Text)
    recipe: Mapped[str | None] = mapped_column(Text)
    submitted_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    started_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    completed_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    logs_url: Mapped[str | None] = mapped_column(Text)
    benchmark_results: Mapped[dict[str, Any] | None] = mapped_column(JSONDocument)
    artifacts: Mapped[dict[str, Any] | None] = mapped_column(JSONDocument)
    # "metadata" is reserved on declarative classes; the column keeps the wire name.
    meta: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSONDocument)
    # Our clock, unlike every stamp above: when the newest POST or PUT for the job arrived.
    # Stale detection judges silence on it, so a reporter whose clock is wrong, or a
    # report replayed days later, cannot make a live job look dead.
    received_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)


class JobEvent(Base):
    """One lifecycle transition; ``id`` is the cursor of both event feeds."""

    __tablename__ = "job_events"
    __table_args__ = (
        Index("ix_job_events_job_pk_id", "job_pk", "id"),
        # Without AUTOINCREMENT SQLite reuses the ids of deleted rows, and a feed cursor
        # past them would never see the events that take them next.
        {"sqlite_autoincrement": True},
    )

    # On PostgreSQL the id is the writing transaction's id plus a fixed shift
    # (collector_event_id(), revision 0008): writers commit in parallel and readers stop
    # at the oldest transaction still running (store/event_ids.py). On SQLite, AUTOINCREMENT.
    id: Mapped[int] = mapped_column(EventId, primary_key=True, server_default=text("collector_event_id()"))
    job_pk: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    status: Mapped[str] = mapped_column(String(32))
    stage: Mapped[str | None] = mapped_column(String(64))
    message: Mapped[str | None] = mapped_column(Text)
    # The time the reporter stamped on the update (its updated_at / submitted_at).
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    # Who wrote it: the credential's name (collector/credentials.py), "env:write" for the
    # spec's token, null on an open server or for events written before names were kept.
    credential: Mapped[str | None] = mapped_column(String(64))


class JobCount(Base):
    """How many jobs each cluster has in each status, kept in step by every write.

    COUNT(*) over the jobs table grows with the table; the list's ``total`` reads
    this instead, so a page costs the same at a thousand jobs or a million.
    """

    __tablename__ = "job_counts"

    cluster: Mapped[str] = mapped_column(String(255), primary_key=True)
    status: Mapped[str] = mapped_column(String(32), primary_key=True)
    jobs: Mapped[int] = mapped_column(BigInteger, server_default="0")


class JobCountStripe(Base):
    """PostgreSQL writers' share of the counts: job_counts plus these rows is the count.

    A write adds its +1/-1 to one of STRIPES rows per (cluster, status), picked at
    random, so concurrent writes moving jobs between the same statuses rarely wait on
    each other's row locks until commit. Readers sum both tables (store/counts.py).
    """

    __tablename__ = "job_count_stripes"

    cluster: Mapped[str] = mapped_column(String(255), primary_key=True)
    status: Mapped[str] = mapped_column(String(32), primary_key=True)
    stripe: Mapped[int] = mapped_column(SmallInteger, primary_key=True, autoincrement=False)
    jobs: Mapped[int] = mapped_column(BigInteger, server_default="0")


class EventIdShift(Base):
    """PostgreSQL only: what collector_event_id() adds to a transaction id (one row).

    Raised by ``collector db upgrade`` and at server start whenever a stored event id is
    not below the feed horizon (a restore into a new cluster, whose transaction ids
    start low again), so new ids stay above every stored one (store/event_ids.py).
    """

    __tablename__ = "event_id_shift"
    __table_args__ = (CheckConstraint("one", name="one_row"),)

    one: Mapped[bool] = mapped_column(Boolean, primary_key=True, server_default=text("true"))
    shift: Mapped[int] = mapped_column(BigInteger, server_default="0")


class BlobFile(Base):
    """One streamed log file or capture segment of a job: its name, progress and state.

    Logs and captures share these tables (``kind``), not their rules (store/logs.py,
    store/captures.py). ``size`` is the contiguous byte count from offset 0,
    ``stored_end`` the end of the furthest chunk (past ``size`` only across a gap);
    ``total`` is a capture segment's declared length (null for logs); ``done`` is a
    log's final flag or a segment's completeness; ``final_size`` where a log was marked
    final; ``sha256`` a complete segment's checksum.
    """

    __tablename__ = "blob_files"
    __table_args__ = (
        # Names may be 4096 characters, past what a btree entry holds: key on their hash.
        UniqueConstraint("job_pk", "kind", "name_key"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_pk: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(8))
    name: Mapped[str] = mapped_column(Text)
    name_key: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(BigInteger, server_default="0")
    stored_end: Mapped[int] = mapped_column(BigInteger, server_default="0")
    total: Mapped[int | None] = mapped_column(BigInteger)
    final_size: Mapped[int | None] = mapped_column(BigInteger)
    done: Mapped[bool] = mapped_column(Boolean, server_default=false())
    sha256: Mapped[str | None] = mapped_column(String(64))
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)


class BlobChunk(Base):
    """Bytes ``[start_offset, end_offset)`` of a blob file; chunks of a file never overlap."""

    __tablename__ = "blob_chunks"

    file_id: Mapped[int] = mapped_column(ForeignKey("blob_files.id", ondelete="CASCADE"), primary_key=True)
    start_offset: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    end_offset: Mapped[int] = mapped_column(BigInteger)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class ClusterProbe(Base):
    """A cluster's newest probe report (``collector probe``) and the health derived from it."""

    __tablename__ = "cluster_probes"

    cluster: Mapped[str] = mapped_column(String(255), primary_key=True)
    # available / degraded / unavailable, by the rules of collector/health.py.
    status: Mapped[str] = mapped_column(String(16))
    detail: Mapped[str | None] = mapped_column(Text)
    # When the probe ran (its clock) and when the report arrived (ours): silence is
    # judged on ours, so a probe host with a wrong clock cannot look alive or dead.
    probed_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    received_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    interval_s: Mapped[float] = mapped_column(Float)
    # When ``status`` took its current value.
    status_since: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    # The report as sent (nodes, partitions, error), for people and dashboards.
    report: Mapped[dict[str, Any]] = mapped_column(JSONDocument)


class SlurmJob(Base):
    """What the cluster probe last saw of one active job in Slurm's queue.

    Its own table rather than columns on ``jobs``: the probe writes it without taking
    the job's write lock, and the lifecycle PUT (the hot path) never touches it.
    """

    __tablename__ = "slurm_jobs"

    job_pk: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    # Slurm's state (PENDING, RUNNING, CANCELLED, ...), null while Slurm never listed the job.
    state: Mapped[str | None] = mapped_column(String(32))
    # Slurm's reason for a pending job (Resources, Priority, ...).
    reason: Mapped[str | None] = mapped_column(Text)
    # The first probe that saw ``state``.
    state_since: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    # The first probe that found the job out of the queue (absent, or finished in
    # Slurm), null while it is queued or running: stale detection counts from here.
    gone_since: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    # The newest probe that asked Slurm about the job.
    observed_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)


class CredentialUse(Base):
    """When each named credential was last used, as the serving processes last wrote it down.

    The tokens file holds no state (many hosts read it); ``collector token list`` reads this.
    """

    __tablename__ = "credential_uses"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    last_used_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)


class Webhook(Base):
    """A subscription: every job event whose status and cluster match is POSTed to ``url``.

    ``start_after`` is the event feed's head when it was added: it hears of events after
    that, never the history before it.
    """

    __tablename__ = "webhooks"
    __table_args__ = (CheckConstraint("format IN ('json', 'slack')", name="format"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    url: Mapped[str] = mapped_column(String(2048))
    statuses: Mapped[list[str]] = mapped_column(JSONDocument)
    # Empty: every cluster.
    clusters: Mapped[list[str]] = mapped_column(JSONDocument)
    secret: Mapped[str | None] = mapped_column(String(256))
    format: Mapped[str] = mapped_column(String(16))
    enabled: Mapped[bool] = mapped_column(Boolean, server_default=true())
    disabled_reason: Mapped[str | None] = mapped_column(Text)
    start_after: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    created_by: Mapped[str | None] = mapped_column(String(64))


class WebhookDelivery(Base):
    """One event on its way to one subscription: pending until a 2xx (sent) or until it gives up (dead).

    Rows come from the event feed (collector/store/deliveries.py ``fan_out``), so they
    exist for every event a subscription matches however the process that wrote the event
    ended. ``claimed_until`` is a sender's lease: past it, another process may send again.
    """

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        UniqueConstraint("webhook_id", "event_id"),
        CheckConstraint("state IN ('pending', 'sent', 'dead')", name="state"),
        # Each subscription's queue in feed order: the claim probes it for the oldest, and it
        # holds only what is still to go, however long the history of sent ones grows.
        Index("ix_webhook_deliveries_pending", "webhook_id", "event_id",
              postgresql_where=text("state = 'pending'"), sqlite_where=text("state = 'pending'")),
    )

    id: Mapped[int] = mapped_column(EventId, primary_key=True, autoincrement=True)
    webhook_id: Mapped[int] = mapped_column(ForeignKey("webhooks.id", ondelete="CASCADE"))
    event_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("job_events.id", ondelete="CASCADE"), index=True)
    state: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    next_attempt_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    claimed_until: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    sent_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    last_status: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(Text)


class WebhookCursor(Base):
    """How far along the event feed deliveries have been made: one row (id 1)."""

    __tablename__ = "webhook_cursor"
    __table_args__ = (CheckConstraint("id = 1", name="one_row"),)

    id: Mapped[int] = mapped_column(SmallInteger, primary_key=True, autoincrement=False)
    position: Mapped[int] = mapped_column(BigInteger)
