"""Webhook delivery: each serving process fans the event feed out to subscriptions and sends what is due.

Off the request path, in a thread per process started by its first request (as the
janitor's). Processes and hosts share the work through the database: one fans out at a
time (the cursor row), and each delivery is held by one sender at a time (a lease), so
nothing is sent twice at once while senders are healthy, and a sender killed mid-send
leaves its delivery to be sent again once the lease ends: at least once. Each process
sends on a small pool of threads, so one receiver that hangs holds one thread for the
timeout, not the others' deliveries.
"""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import hashlib
import hmac
import json
import logging
import threading
from typing import Any
from urllib.parse import urlencode

import requests
from flask import Flask

from collector import fanout
from collector import metrics
from collector.contract import StreamEvent
from collector.db import Database
from collector.per_process import PerProcess
from collector.per_process import keep_running
from collector.settings import Settings
from collector.store import deliveries
from collector.store.deliveries import Claimed

log = logging.getLogger("collector.webhooks")
SENDERS = 8  # per process: receivers answering at once
CONNECT_TIMEOUT_S = 5.0
TIMEOUT_S = 10.0  # no answer in this long is a failed attempt
USER_AGENT = "collector-webhooks/1"
ERROR_BYTES = 500


def sign(secret: str, body: bytes) -> str:
    """The ``X-Collector-Signature`` value of ``body``: ``sha256=`` and the hex HMAC-SHA256 under ``secret``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def job_link(public_url: str | None, event: StreamEvent) -> str | None:
    """The page's URL that opens the event's job, when the collector knows where people reach it."""
    if not public_url:
        return None
    query = {"job": event.job_id, **({"job_cluster": event.cluster} if event.cluster else {})}
    return f"{public_url}/?{urlencode(query)}"


def body(claimed: Claimed, event: StreamEvent, public_url: str | None) -> bytes:
    """What a delivery POSTs: the collector's JSON, or a Slack message."""
    if claimed.format == "slack":
        who = f"{event.cluster}/{event.job_id}" if event.cluster else event.job_id
        text = f"{who} {event.status}"
        if event.job.exit_code is not None:
            text += f" (exit {event.job.exit_code})"
        if event.message:
            text += f": {event.message}"
        if (link := job_link(public_url, event)) is not None:
            text += f" {link}"
        document: dict[str, Any] = {"text": text}
    else:
        document = {
            "delivery_id": claimed.id,
            "webhook_id": claimed.webhook_id,
            "event": event.model_dump(mode="json", include={"id", "job_id", "cluster", "status", "stage", "message",
                                                            "created_at"}),
            "job": event.job.model_dump(mode="json"),
        }
        if (link := job_link(public_url, event)) is not None:
            document["link"] = link
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()


def headers(claimed: Claimed, event: StreamEvent, payload: bytes) -> dict[str, str]:
    """A delivery's headers: its id, the event's status and, with a secret, the body's signature."""
    found = {"Content-Type": "application/json", "User-Agent": USER_AGENT,
             "X-Collector-Delivery": str(claimed.id), "X-Collector-Event": event.status}
    if claimed.secret is not None:
        found["X-Collector-Signature"] = sign(claimed.secret, payload)
    return found


class Dispatcher:
    """This process's share of the deliveries, until the server shuts down."""

    def __init__(self, database: Database, settings: Settings, hub: fanout.Hub) -> None:
        self.database = database
        self.settings = settings
        self.hub = hub
        self._lock = threading.Lock()
        self._in_flight = 0
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._thread = PerProcess("collector-webhooks", self._run)

    def ensure_running(self) -> None:
        """Start the delivery thread in this process if it is not running (cheap; every request calls it)."""
        self._thread.ensure_running()

    def _run(self) -> None:
        with self._lock:
            self._in_flight = 0  # a forked child inherits the parent's count, not its senders
            self._pool = concurrent.futures.ThreadPoolExecutor(SENDERS, thread_name_prefix="collector-webhook")
        while not self.hub.closed:
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - a database outage must not end the thread; the next tick retries
                log.warning("webhook delivery failed; retrying in %g s", self.settings.webhook_poll_s, exc_info=True)
            self.hub.wait_closed(self.settings.webhook_poll_s)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def tick(self) -> None:
        """Fan the feed's new events out, then hand what is due to the senders (as many as are free)."""
        now = dt.datetime.now(dt.UTC)
        new_events, due = self.database.run(lambda conn: deliveries.work(conn, now))
        if new_events:
            due = self.database.run(lambda conn: deliveries.fan_out(conn, now), write=True) > 0 or due
        with self._lock:
            free = SENDERS - self._in_flight
        if not due or free <= 0 or self._pool is None:
            return
        claimed = self.database.run(lambda conn: deliveries.claim(conn, now, free), write=True)
        for delivery in claimed:
            with self._lock:
                self._in_flight += 1
            self._pool.submit(self._send, delivery)

    def _send(self, claimed: Claimed) -> None:
        # A subscription's deliveries go one after another (in feed order), so the sender
        # that ends one takes the subscription's next at once rather than a poll later.
        current: Claimed | None = claimed
        try:
            while current is not None and not self.hub.closed:
                outcome = self.deliver(current)
                metrics.webhook_delivered(outcome)
                current = self._next_of(current.webhook_id) if outcome != deliveries.RETRIED else None
        except Exception:  # noqa: BLE001 - the lease runs out and another try follows
            log.warning("webhook delivery %d failed", (current or claimed).id, exc_info=True)
        finally:
            with self._lock:
                self._in_flight -= 1

    def _next_of(self, webhook_id: int) -> Claimed | None:
        now = dt.datetime.now(dt.UTC)
        taken = self.database.run(lambda conn: deliveries.claim(conn, now, 1, webhook_id=webhook_id), write=True)
        return taken[0] if taken else None

    def deliver(self, claimed: Claimed) -> str:
        """POST one delivery and record the answer; its outcome: sent, retried or dead."""
        event = claimed.event
        payload = body(claimed, event, self.settings.public_url)
        status: int | None
        try:
            # No redirects: a subscription names the URL the collector calls, nothing else.
            with requests.post(claimed.url, data=payload, headers=headers(claimed, event, payload),
                               timeout=(CONNECT_TIMEOUT_S, TIMEOUT_S), allow_redirects=False,
                               stream=True) as response:
                status = response.status_code
                # The start of a refusal says why; a receiver's whole page is never read.
                error = None if 200 <= status < 300 else response.raw.read(
                    ERROR_BYTES, decode_content=True).decode(errors="replace")
        except requests.RequestException as exc:
            status, error = None, f"{type(exc).__name__}: {exc}"
        now = dt.datetime.now(dt.UTC)
        outcome = self.database.run(lambda conn: deliveries.finish(conn, claimed, status, error, now), write=True)
        if outcome != deliveries.SENT:
            log.info("webhook %d delivery %d (event %d) %s: %s", claimed.webhook_id, claimed.id, claimed.event_id,
                     outcome, f"answered {status}" if status is not None else error)
        return outcome


def init_app(app: Flask, database: Database, settings: Settings) -> None:
    """Give ``app`` a dispatcher, started in each process at its first request (at boot under gunicorn)."""
    dispatcher = Dispatcher(database, settings, fanout.get_hub(app))
    app.extensions["collector.webhooks"] = dispatcher
    keep_running(app, dispatcher.ensure_running)


def get_dispatcher(app: Flask) -> Dispatcher:
    """The dispatcher of ``app``."""
    dispatcher: Dispatcher = app.extensions["collector.webhooks"]
    return dispatcher


