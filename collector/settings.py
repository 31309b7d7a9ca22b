"""Typed settings, read once from ``COLLECTOR_*`` environment variables and CLI flags."""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

DEFAULT_DB_PATH = Path("~/.local/state/collector/status.db")
DEFAULT_TOKEN_ENV = "SRTCTL_STATUS_TOKEN"
DEFAULT_READ_TOKEN_ENV = "SRTCTL_STATUS_READ_TOKEN"
# Every body, a log or capture chunk included: the srtctl streamer sends chunks of at
# most 1 MiB, so the guard's Content-Length check is also the chunk limit.
MAX_BODY_BYTES = 1024 * 1024
# COLLECTOR_LOG_FORMAT: the historical text lines, or one JSON object per line (collector/log_format.py).
LOG_FORMATS = ("text", "json")
# Who may scrape /metrics: anyone (like /api/health), or a client with any credential.
METRICS_AUTH = ("open", "token")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


class SettingsError(ValueError):
    """A configuration the collector refuses to start with."""


def database_url(value: str | None) -> str:
    """Turn ``--db`` (a file path or a SQLAlchemy URL) into a SQLAlchemy URL."""
    if not value:
        value = str(DEFAULT_DB_PATH)
    if "://" not in value:
        return "sqlite:///" + str(Path(value).expanduser().resolve())
    # psycopg 3 is the only PostgreSQL driver we ship; plain URLs should just work.
    for prefix in ("postgres://", "postgresql://"):
        if value.startswith(prefix):
            return "postgresql+psycopg://" + value[len(prefix):]
    return value


def is_loopback(host: str) -> bool:
    """Whether binding to ``host`` keeps the collector on this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _float(environ: Mapping[str, str], name: str, default: float) -> float:
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise SettingsError(f"{name} must be a number, got {raw!r}") from None


def _flag(value: str | None) -> bool:
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}


def _int(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise SettingsError(f"{name} must be an integer, got {raw!r}") from None


def _level(environ: Mapping[str, str], name: str) -> str | None:
    raw = (environ.get(name) or "").strip().lower()
    if raw and raw not in LOG_LEVELS:
        raise SettingsError(f"{name} must be one of {', '.join(LOG_LEVELS)}, got {raw!r}")
    return raw or None


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything the collector is configured with; built once, never mutated."""

    database_url: str = dataclasses.field(default_factory=lambda: database_url(None))
    host: str = "127.0.0.1"
    port: int = 8080
    token_env: str = DEFAULT_TOKEN_ENV
    read_token_env: str = DEFAULT_READ_TOKEN_ENV
    write_token: str | None = None
    read_token: str | None = None
    # Named credentials (collector/credentials.py), re-read when the file changes.
    tokens_file: Path | None = None
    allow_unauthenticated: bool = False
    cors_origins: tuple[str, ...] = ()
    max_body_bytes: int = MAX_BODY_BYTES
    # SQLite is migrated on start (one user, one file); PostgreSQL never is, because a
    # shared database is upgraded deliberately, before the new code starts.
    auto_migrate: bool | None = None
    # Database connections a process keeps open; None: request_threads + 2 (see pool_kept).
    pool_size: int | None = None
    pool_max_overflow: int = 10
    # Event streams (docs/api.md, "Streams"). A heartbeat after this many idle seconds
    # keeps proxies from timing the connection out; the lifetime bounds how long one
    # request holds a worker thread (clients resume with Last-Event-ID, losing nothing).
    stream_heartbeat_s: float = 30.0
    stream_max_lifetime_s: float = 900.0
    # How often a process reads the feed when nothing wakes it: the only wake-up on
    # SQLite, a fallback on PostgreSQL while its LISTEN connection is down.
    stream_poll_s: float = 0.5
    # Ordinary requests one process runs at once (collector/admission.py); gunicorn's
    # thread count per worker is this plus max_streams. None: see request_threads.
    threads: int | None = None
    # Streams one process holds at once; each holds a thread (collector/serving.py
    # adds this many threads to every worker, so writes keep theirs).
    max_streams: int = 500
    # How every log line is written, under `collector serve` and gunicorn alike.
    log_format: str = "text"
    # /metrics: "open" like /api/health, or "token" (any credential). None: "token" when
    # requests need a token at all, else "open".
    metrics_auth: str | None = None
    # Stale jobs (collector/store/stale.py): an active job that left Slurm's queue this
    # long ago without a final report, or that sent nothing at all for stale_silence_s
    # (0: never), is marked failed; one process of the deployment checks every stale_check_s
    # (collector/sweeper.py).
    stale_grace_s: float = 120.0
    stale_silence_s: float = 86_400.0
    stale_check_s: float = 60.0
    # A request that waited this long for a slot is answered 503 and never run: the
    # srtctl reporter gives up after 5 s, so past that nobody is listening for the answer.
    queue_timeout_s: float = 5.0
    # gunicorn (collector/serving.py), under `collector serve` and deploy/gunicorn.conf.py
    # alike. None: one worker on SQLite (it has one writer), 2 x CPUs on PostgreSQL.
    workers: int | None = None
    keepalive_s: int = 5
    worker_timeout_s: int = 60
    graceful_timeout_s: int = 30
    max_requests: int = 20_000
    # Levels of the collector's loggers, its per-request line, and gunicorn's own lines
    # (None: "info" under deploy/gunicorn.conf.py, "warning" under `collector serve`,
    # whose startup line is its own).
    log_level: str = "info"
    access_log_level: str = "info"
    server_log_level: str | None = None
    # Webhooks (collector/webhook_delivery.py): where people open the page (the links in
    # Slack messages; None: no link), and how often each process looks for work.
    public_url: str | None = None
    webhook_poll_s: float = 0.5

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Read settings from ``COLLECTOR_*`` variables; keyword arguments win."""
        env = os.environ if environ is None else environ
        token_env = overrides.pop("token_env", None) or env.get("COLLECTOR_TOKEN_ENV") or DEFAULT_TOKEN_ENV
        read_token_env = (
            overrides.pop("read_token_env", None) or env.get("COLLECTOR_READ_TOKEN_ENV") or DEFAULT_READ_TOKEN_ENV
        )
        origins = tuple(o.strip() for o in env.get("COLLECTOR_CORS_ORIGINS", "").split(",") if o.strip())
        values: dict[str, Any] = dict(
            database_url=database_url(env.get("COLLECTOR_DATABASE_URL") or env.get("COLLECTOR_DB")),
            host=env.get("COLLECTOR_HOST", "127.0.0.1"),
            port=_int(env, "COLLECTOR_PORT", 8080),
            token_env=token_env,
            read_token_env=read_token_env,
            write_token=env.get(token_env) or None,
            read_token=env.get(read_token_env) or None,
            tokens_file=env.get("COLLECTOR_TOKENS_FILE") or None,
            allow_unauthenticated=_flag(env.get("COLLECTOR_ALLOW_UNAUTHENTICATED")),
            cors_origins=origins,
            pool_size=_int(env, "COLLECTOR_POOL_SIZE", 0) or None,
            pool_max_overflow=_int(env, "COLLECTOR_POOL_MAX_OVERFLOW", 10),
            stream_heartbeat_s=_float(env, "COLLECTOR_STREAM_HEARTBEAT", 30.0),
            stream_max_lifetime_s=_float(env, "COLLECTOR_STREAM_MAX_LIFETIME", 900.0),
            stream_poll_s=_float(env, "COLLECTOR_STREAM_POLL_INTERVAL", 0.5),
            max_streams=_int(env, "COLLECTOR_MAX_STREAMS", 500),
            threads=_int(env, "COLLECTOR_THREADS", 0) if env.get("COLLECTOR_THREADS") else None,
            log_format=(env.get("COLLECTOR_LOG_FORMAT") or "text").strip().lower(),
            metrics_auth=(env.get("COLLECTOR_METRICS_AUTH") or "").strip().lower() or None,
            stale_grace_s=_float(env, "COLLECTOR_STALE_GRACE", 120.0),
            stale_silence_s=_float(env, "COLLECTOR_STALE_SILENCE", 86_400.0),
            stale_check_s=_float(env, "COLLECTOR_STALE_CHECK_INTERVAL", 60.0),
            queue_timeout_s=_float(env, "COLLECTOR_QUEUE_TIMEOUT", 5.0),
            workers=_int(env, "COLLECTOR_WORKERS", 0) or None,
            keepalive_s=_int(env, "COLLECTOR_KEEPALIVE", 5),
            worker_timeout_s=_int(env, "COLLECTOR_WORKER_TIMEOUT", 60),
            graceful_timeout_s=_int(env, "COLLECTOR_GRACEFUL_TIMEOUT", 30),
            max_requests=_int(env, "COLLECTOR_MAX_REQUESTS", 20_000),
            log_level=_level(env, "COLLECTOR_LOG_LEVEL") or "info",
            access_log_level=_level(env, "COLLECTOR_ACCESS_LOG_LEVEL") or "info",
            server_log_level=_level(env, "GUNICORN_LOG_LEVEL"),
            public_url=(env.get("COLLECTOR_PUBLIC_URL") or "").strip().rstrip("/") or None,
            webhook_poll_s=_float(env, "COLLECTOR_WEBHOOK_POLL_INTERVAL", 0.5),
        )
        values.update({k: v for k, v in overrides.items() if v is not None})
        if "database_url" in overrides and overrides["database_url"] is not None:
            values["database_url"] = database_url(overrides["database_url"])
        values["cors_origins"] = tuple(values["cors_origins"])
        if values["tokens_file"] is not None:
            values["tokens_file"] = Path(values["tokens_file"]).expanduser().absolute()
        return cls(**values)

    @property
    def requires_token(self) -> bool:
        """Whether requests need a credential: a write token or a tokens file is configured."""
        return bool(self.write_token) or self.tokens_file is not None

    @property
    def metrics_open(self) -> bool:
        """Whether /metrics is served without a credential."""
        return (self.metrics_auth or ("token" if self.requires_token else "open")) == "open"

    @property
    def is_sqlite(self) -> bool:
        """Whether the configured database is a SQLite file."""
        return self.database_url.startswith("sqlite")

    @property
    def worker_count(self) -> int:
        """gunicorn workers: as configured, else one on SQLite and two per CPU on PostgreSQL."""
        if self.workers:
            return self.workers
        return 1 if self.is_sqlite else 2 * (os.cpu_count() or 1)

    @property
    def request_threads(self) -> int:
        """Ordinary requests a process runs at once: as configured, else two on SQLite and eight on PostgreSQL.

        SQLite's driver lets go of the GIL for every row it steps through, so each row of
        a list or a feed page hands the GIL to another request thread and waits to get it
        back. Past two threads (one in Python, one in SQLite or a socket) that traffic
        took half the process's CPU in the kernel and cut list pages from ~400 to ~230 a
        second (docs/performance.md, "SQLite: two request threads"). psycopg lets go once
        per statement, so PostgreSQL workers keep eight.
        """
        if self.threads is not None:
            return self.threads
        return 2 if self.is_sqlite else 8

    @property
    def pool_kept(self) -> int:
        """Database connections a process keeps open: as configured, else one per request thread and two more.

        A pool smaller than the requests that run at once closes a connection on nearly
        every return and opens another on the next checkout (a backend started, a login
        and the catalog caches warmed each time): at the old default of 5 against 8
        threads, a busy worker opened dozens of sessions a second and lost a fifth of
        its throughput (docs/performance.md). The two spare serve the janitor and the
        streams' catch-up reads.
        """
        return self.pool_size or self.request_threads + 2

    @property
    def migrates_on_start(self) -> bool:
        """Whether the app upgrades the schema itself before serving."""
        return self.is_sqlite if self.auto_migrate is None else self.auto_migrate

    def check(self) -> None:
        """Refuse configurations the spec forbids: an open server off loopback, a lone read token."""
        if self.read_token and not self.requires_token:
            raise SettingsError(
                f"a read token (${self.read_token_env}) is set without a write token (${self.token_env}) "
                "or a tokens file (COLLECTOR_TOKENS_FILE): set one of them, or unset the read token"
            )
        if not self.requires_token and not self.allow_unauthenticated and not is_loopback(self.host):
            raise SettingsError(
                f"refusing to listen on {self.host} without a token: set COLLECTOR_TOKENS_FILE or ${self.token_env}, "
                "bind to 127.0.0.1, or pass --allow-unauthenticated on a network trusted end to end"
            )
        if self.max_body_bytes <= 0:
            raise SettingsError("max_body_bytes must be positive")
        for name in ("stream_heartbeat_s", "stream_max_lifetime_s", "stream_poll_s"):
            if not getattr(self, name) > 0:
                raise SettingsError(f"{name} must be a positive number of seconds")
        for name in ("stale_grace_s", "stale_check_s"):
            if not getattr(self, name) > 0:
                raise SettingsError(f"{name} must be a positive number of seconds")
        if not self.stale_silence_s >= 0:
            raise SettingsError("stale_silence_s (COLLECTOR_STALE_SILENCE) must be zero (off) or more seconds")
        if self.threads is not None and self.threads < 1:
            raise SettingsError("threads (COLLECTOR_THREADS) must be at least 1")
        if not self.queue_timeout_s > 0:
            raise SettingsError("queue_timeout_s (COLLECTOR_QUEUE_TIMEOUT) must be a positive number of seconds")
        if self.pool_size is not None and self.pool_size < 1:
            raise SettingsError("pool_size (COLLECTOR_POOL_SIZE) must be at least 1")
        if self.pool_max_overflow < 0:
            raise SettingsError("pool_max_overflow (COLLECTOR_POOL_MAX_OVERFLOW) must be zero or more")
        if self.workers is not None and self.workers < 1:
            raise SettingsError("workers (COLLECTOR_WORKERS, --workers) must be at least 1")
        if self.max_streams < 0:
            raise SettingsError("max_streams must be zero (streams off) or more")
        if not self.webhook_poll_s > 0:
            raise SettingsError("webhook_poll_s (COLLECTOR_WEBHOOK_POLL_INTERVAL) must be a positive number of seconds")
        if self.public_url is not None and not re.match(r"https?://[^/\s]+", self.public_url):
            raise SettingsError(f"COLLECTOR_PUBLIC_URL must be an http:// or https:// URL, got {self.public_url!r}")
        if self.log_format not in LOG_FORMATS:
            raise SettingsError(f"COLLECTOR_LOG_FORMAT must be 'text' or 'json', got {self.log_format!r}")
        if self.metrics_auth is not None and self.metrics_auth not in METRICS_AUTH:
            raise SettingsError(f"COLLECTOR_METRICS_AUTH must be 'open' or 'token', got {self.metrics_auth!r}")
        if self.metrics_auth == "token" and not self.requires_token:
            # With no credentials every route is open, /metrics too: refuse rather than serve it open.
            raise SettingsError(
                f"COLLECTOR_METRICS_AUTH=token needs credentials: set COLLECTOR_TOKENS_FILE or ${self.token_env} "
                f"(and give the scraper a read token), or COLLECTOR_METRICS_AUTH=open"
            )
