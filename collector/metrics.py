"""Prometheus metrics: every metric the collector exports, what feeds them, and ``/metrics``.

Under gunicorn each worker writes its metrics to files in ``PROMETHEUS_MULTIPROC_DIR``
(deploy/gunicorn.conf.py sets it up) and a scrape, answered by any worker, adds up the
files of all of them. prometheus_client picks that mode when it is first imported, from
that variable, so the variable must be set before anything imports collector (the
gunicorn config sets it before its own first import); ``collector serve`` leaves it
unset and a scrape reads this process's registry. Values read from the database at
scrape time (the clusters' report ages) are computed by the scraping process and never
written to the files.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING

from flask import Blueprint
from flask import Flask
from flask import Response
from flask import g
from flask import request
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client import REGISTRY
from prometheus_client import Counter
from prometheus_client import Gauge
from prometheus_client import Histogram
from prometheus_client import disable_created_metrics
from prometheus_client import generate_latest
from prometheus_client import values
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import QueuePool

from collector import per_process
from collector.cluster_contract import Health
from collector.db import Database
from collector.db import get_db
from collector.guard import METRICS_PATH
from collector.openapi import operation
from collector.store import activity
from collector.store import clusters
from collector.store import deliveries
from collector.store import event_ids

if TYPE_CHECKING:
    from collector.fanout import Hub  # fanout counts streams here: a runtime import would be circular

log = logging.getLogger("collector")

# The mode prometheus_client chose at its import, not the variable now: they differ if
# the variable was set after the import, and the files would then be empty.
MULTIPROCESS = bool(getattr(values.ValueClass, "_multiprocess", False))
if MULTIPROCESS:
    # Each update checks for a fork by the process id: the cached one (renewed at every
    # fork), not a system call per update, eight times per PUT (docs/performance.md).
    # Before any metric exists, so every value is of this class.
    values.ValueClass = values.MultiProcessValue(process_identifier=per_process.pid)  # type: ignore[no-untyped-call]
# The *_created series double the series count and do not exist in multiprocess mode.
disable_created_metrics()  # type: ignore[no-untyped-call]  # prometheus_client leaves it unannotated

# Methods are labels as they are; anything else (any token is a valid method) is "other",
# so a client cannot grow the label set.
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"})
UNMATCHED = "unmatched"
# Requests here take milliseconds; the defaults start at 5 ms and would lump them together.
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
EXPOSITION = {"type": "string", "description": "the Prometheus text exposition format"}

REQUESTS = Counter(
    "collector_http_requests", "HTTP requests answered, by route template, method and status.",
    ["route", "method", "status"],
)
DURATION = Histogram(
    "collector_http_request_duration_seconds",
    "Time from the start of a request to its response (a stream's: to its headers).",
    ["route", "method"], buckets=_BUCKETS,
)
INGESTED_BYTES = Counter(
    "collector_ingested_bytes", "Log and capture bytes newly stored (repeats of stored bytes not counted).",
    ["kind"],
)
EVENTS_APPENDED = Counter("collector_events_appended", "Job events written to the feed.")
STALE_MARKED = Counter(
    "collector_stale_jobs_marked", "Active jobs the collector marked failed, by the rule that found them stale.",
    ["rule"],
)
for _rule in ("left_queue", "silent"):
    STALE_MARKED.labels(rule=_rule)
SHED = Counter(
    "collector_requests_shed",
    "Requests answered 503 without running: they waited longer than COLLECTOR_QUEUE_TIMEOUT for a slot.",
)
TOKENS_RELOADS = Counter(
    "collector_tokens_file_reloads",
    "Times a process re-read the changed tokens file: ok, or failed (it kept the credentials read before).",
    ["result"],
)
OPEN_STREAMS = Gauge("collector_open_streams", "Event streams open now.", multiprocess_mode="livesum")
# livesum: a host's scrape says whether one of its live workers sweeps (a dead one's file
# is dropped at child_exit); summed over every host it is 1 while the deployment has a sweeper.
SWEEPER_LEADER = Gauge(
    "collector_stale_sweeper_leader", "1 if a process of this server is the deployment's stale-job sweeper, else 0.",
    multiprocess_mode="livesum",
)
POOL_CONNECTIONS = Gauge(
    "collector_db_pool_connections", "Database connections of the pools, checked out by a request or idle.",
    ["state"], multiprocess_mode="livesum",
)
WEBHOOK_DELIVERIES = Counter(
    "collector_webhook_deliveries",
    "Webhook delivery attempts by outcome: sent (2xx), retried (to be tried again) or dead (given up, or 410 Gone).",
    ["outcome"],
)
for _outcome in ("sent", "retried", "dead"):
    WEBHOOK_DELIVERIES.labels(outcome=_outcome)
for _kind in ("logs", "captures"):
    INGESTED_BYTES.labels(kind=_kind)  # present at 0 from the start, so rate() has a base
_CHECKED_OUT = POOL_CONNECTIONS.labels(state="checked_out")
_IDLE = POOL_CONNECTIONS.labels(state="idle")
# How often each process writes its pools' gauges: a scrape sees the others' at most this late.
POOL_SAMPLE_S = 1.0
_pooled: weakref.WeakSet[Engine] = weakref.WeakSet()

bp = Blueprint("metrics", __name__)


@bp.get(METRICS_PATH)
@operation(responses={200: {"text/plain": EXPOSITION}})
def scrape() -> Response:
    """Prometheus metrics of every process of this collector."""
    sample_pools()  # this process's pools as they are now; the other workers' as last sampled
    return Response(generate_latest(_Scrape(get_db())), headers={"Content-Type": CONTENT_TYPE_LATEST})


class _Scrape:
    """What one scrape exports: the processes' metrics and the values read from the database now."""

    def __init__(self, database: Database) -> None:
        self.database = database

    def collect(self) -> Iterator[Metric]:
        """Yield every metric family of the scrape."""
        if MULTIPROCESS:
            # prometheus_client leaves the multiprocess collector unannotated.
            yield from MultiProcessCollector(None).collect()  # type: ignore[no-untyped-call]
        else:
            yield from REGISTRY.collect()
        yield from _database_families(self.database)


def _database_families(database: Database) -> Iterator[GaugeMetricFamily]:
    up = GaugeMetricFamily("collector_database_up", "1 if this scrape's database query succeeded, else 0.")
    try:
        reports = database.run(activity.last_reports)
        now = dt.datetime.now(dt.UTC)
        probed = database.run(lambda conn: clusters.health(conn, now))
        held = database.run(event_ids.oldest_writer_age)
        pending = database.run(deliveries.pending_count)
    except SQLAlchemyError as exc:
        # The rest of the scrape is worth most while the database is down: answer it.
        log.warning("metrics: database query failed: %s", str(exc).strip().splitlines()[0])
        up.add_metric([], 0)
        yield up
        return
    up.add_metric([], 1)
    yield up
    ages = GaugeMetricFamily(
        "collector_cluster_last_report_age_seconds",
        "Seconds since the newest updated_at a job of the cluster reported (reporter clocks).",
        labels=["cluster"],
    )
    for cluster, last in reports:
        ages.add_metric([cluster], (now - last).total_seconds())
    yield ages
    status = GaugeMetricFamily(
        "collector_cluster_status",
        "1 for the cluster's current health from its probe (unavailable once the probe is silent), else 0.",
        labels=["cluster", "status"],
    )
    probe_ages = GaugeMetricFamily(
        "collector_cluster_probe_age_seconds", "Seconds since the cluster's newest probe report arrived.",
        labels=["cluster"],
    )
    for cluster, current, age in probed:
        for health in Health:
            status.add_metric([cluster, health.value], 1.0 if health.value == current else 0.0)
        probe_ages.add_metric([cluster], age)
    yield status
    yield probe_ages
    yield GaugeMetricFamily(
        "collector_webhook_deliveries_pending", "Webhook deliveries still to go (due now or waiting to retry).",
        value=pending,
    )
    yield GaugeMetricFamily(
        "collector_feed_held_seconds",
        "PostgreSQL: how long the oldest write transaction on the server has run; the event feed waits for it.",
        value=held,
    )


# Each (route, method, status)'s counter and histogram, found once: labels() checks and
# converts its values and takes a lock on every call. Bounded as the labels are.
_children: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}


def _observe(response: Response) -> Response:
    rule, method = request.url_rule, request.method
    # The rule's template (/api/jobs/<job_id>), never the path: the label set stays bounded.
    key = (rule.rule if rule is not None else UNMATCHED, method if method in _METHODS else "other",
           response.status_code)
    children = _children.get(key)
    if children is None:
        route, method, status = key
        children = _children.setdefault(key, (REQUESTS.labels(route, method, str(status)),
                                              DURATION.labels(route, method)))
    requests, duration = children
    requests.inc()
    # The guard's start (its first hook), so this and the access log's time agree.
    duration.observe(time.perf_counter() - g.get("started", time.perf_counter()))
    return response


def stored_upload(kind: str, new_bytes: int, created_job: bool) -> None:
    """Count a committed log or capture upload: its new bytes, and the event of a placeholder job it created."""
    if new_bytes:
        INGESTED_BYTES.labels(kind=kind).inc(new_bytes)
    if created_job:
        EVENTS_APPENDED.inc()


def webhook_delivered(outcome: str) -> None:
    """Count a webhook delivery attempt's outcome: sent, retried or dead."""
    WEBHOOK_DELIVERIES.labels(outcome=outcome).inc()


def event_appended() -> None:
    """Count a committed job event."""
    EVENTS_APPENDED.inc()


def stale_marked(rule: str) -> None:
    """Count a job the janitor marked failed."""
    STALE_MARKED.labels(rule=rule).inc()


def sweeper_leader(leading: bool) -> None:
    """Count this process in or out as the stale-job sweeper."""
    # inc/dec, not set: several apps in one process (tests) each count their own janitor.
    if leading:
        SWEEPER_LEADER.inc()
    else:
        SWEEPER_LEADER.dec()


def tokens_file_reloaded(ok: bool) -> None:
    """Count a re-read of the tokens file, or a change that could not be used."""
    TOKENS_RELOADS.labels(result="ok" if ok else "failed").inc()


def request_shed() -> None:
    """Count a request shed after its queue timeout."""
    SHED.inc()


def stream_opened() -> None:
    """Count a stream that took its slot."""
    OPEN_STREAMS.inc()


def stream_closed() -> None:
    """Count a stream that gave its slot back."""
    OPEN_STREAMS.dec()


def watch_pool(engine: Engine) -> None:
    """Count ``engine``'s pool in the pool gauges from the next sample on (``sample_pools``)."""
    _pooled.add(engine)


def sample_pools() -> None:
    """Set the pool gauges from this process's pools as they are now.

    Each process samples its own pools (every ``POOL_SAMPLE_S``, and at a scrape it
    answers): in multiprocess mode the scraping worker cannot read the other workers'
    pools, so each worker's file holds its own counts and the scrape adds up the live
    workers'. Sampled rather than counted from the pools' checkout and checkin events,
    which wrote the metric files four times per request (docs/performance.md). Idle counts
    the connections waiting in a pool.
    """
    pools = [engine.pool for engine in list(_pooled)]
    kept = [pool for pool in pools if isinstance(pool, QueuePool)]  # the others keep no connections
    _CHECKED_OUT.set(sum(pool.checkedout() for pool in kept))
    _IDLE.set(sum(pool.checkedin() for pool in kept))


def _sample_pools_until_closed(hub: Hub) -> None:
    while not hub.closed:
        sample_pools()
        hub.wait_closed(POOL_SAMPLE_S)


def init_app(app: Flask, database: Database, hub: Hub) -> None:
    """Count ``app``'s requests and ``database``'s pool (sampled until ``hub`` closes), and serve ``/metrics``."""
    watch_pool(database.engine)
    sampler = per_process.PerProcess("collector-pool-gauges", lambda: _sample_pools_until_closed(hub))
    per_process.keep_running(app, sampler)
    app.after_request(_observe)
    app.register_blueprint(bp)
