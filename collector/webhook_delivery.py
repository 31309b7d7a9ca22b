"""Webhook delivery: each serving process fans the event feed out to subscriptions and sends what is due.

Off the request path, in a thread per process started at worker boot or by its first
request (as the janitor's). Processes and hosts share the work through the database: one
fans out at a time (the cursor row), and each delivery is held by one sender at a time (a
lease), so nothing is sent twice at once while senders are healthy, and a sender killed
mid-send leaves its delivery to be sent again once the lease ends: at least once. Each
process sends on a small pool of threads over kept-alive connections, so one receiver
that hangs holds one thread for the timeout, not the others' deliveries.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime as dt
import functools
import hashlib
import hmac
import json
import logging
import math
import queue
import threading
import time
from typing import Any
from urllib.parse import urlencode

from flask import Flask

from collector import fanout
from collector import metrics
from collector import webhook_http
from collector.contract import StreamEvent
from collector.db import Database
from collector.per_process import PerProcess
from collector.per_process import keep_running
from collector.settings import Settings
from collector.store import deliveries
from collector.store.deliveries import Claimed

log = logging.getLogger("collector.webhooks")
SENDERS = 8  # per process: receivers answering at once
USER_AGENT = "collector-webhooks/1"
LINGER_S = 0.02  # after a sender answers, how long the others get to answer in the same turn
RUN_BUDGET_S = 10.0  # no delivery of a run starts later than this after its first (the lease is 30 s)


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
    """This process's share of the deliveries, until the server shuts down.

    One loop per process owns the database side: each turn records the answers that came
    back, fans out new events (at most every poll interval) and claims what is due for
    the free senders, all in one transaction, so under load one transaction serves many
    deliveries. The senders only POST; a finished send wakes the loop, which claims that
    subscription's next delivery at once.
    """

    def __init__(self, database: Database, settings: Settings, hub: fanout.Hub) -> None:
        self.database = database
        self.settings = settings
        self.hub = hub
        self._answers: queue.SimpleQueue[list[deliveries.Answer]] = queue.SimpleQueue()  # a run's, together
        self._woken = threading.Event()
        self._in_flight = 0  # touched by the loop only
        self.thread = PerProcess("collector-webhooks", self._run)
        self._receivers = webhook_http.Receivers()  # the environment's proxies read once, here

    def ensure_running(self) -> None:
        """Start the delivery thread in this process if it is not running (cheap; every request calls it)."""
        self.thread.ensure_running()

    def _run(self) -> None:
        # A forked child inherits the parent's state, not its senders or its connections.
        self._answers, self._in_flight = queue.SimpleQueue(), 0
        self._receivers = webhook_http.Receivers(self._receivers.proxies)
        pool = concurrent.futures.ThreadPoolExecutor(SENDERS, thread_name_prefix="collector-webhook")
        unsaved: list[deliveries.Answer] = []
        fanned_out = -math.inf
        try:
            while not self.hub.closed:
                self._woken.clear()
                unsaved += self._drain()
                now = dt.datetime.now(dt.UTC)
                fan = time.monotonic() - fanned_out >= self.settings.webhook_poll_s
                try:
                    busy, claimed, caught_up = self.turn(unsaved, now, fan)
                except Exception:  # noqa: BLE001 - a database outage must not end the thread; the next turn retries
                    log.warning("webhook delivery failed; retrying in %g s", self.settings.webhook_poll_s,
                                exc_info=True)
                    busy, claimed = False, []
                else:
                    unsaved = []
                    if fan and caught_up:
                        fanned_out = time.monotonic()  # else the feed holds more: fan out again at once
                for run in claimed:
                    self._in_flight += 1
                    pool.submit(self._send, run)
                if not busy:
                    self._woken.wait(self.settings.webhook_poll_s)
                    if self._in_flight > 1:
                        # Let the other runs in flight answer too, so one transaction records them all.
                        time.sleep(LINGER_S)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
            self._record_before_leaving(unsaved + self._drain())
            self._receivers.close()

    def _record_before_leaving(self, answers: list[deliveries.Answer]) -> None:
        # A clean shutdown writes down what receivers already answered, or a restart sends it again.
        if answers:
            try:
                self.database.run(lambda conn: deliveries.finish(conn, answers), write=True)
            except Exception:  # noqa: BLE001 - at worst those are sent again after the lease: at least once
                log.warning("could not record %d webhook answers at shutdown", len(answers), exc_info=True)

    def _drain(self) -> list[deliveries.Answer]:
        answers = []
        with contextlib.suppress(queue.Empty):
            while True:
                answers += self._answers.get_nowait()
                self._in_flight -= 1
        return answers

    def turn(self, answers: list[deliveries.Answer], now: dt.datetime, fan: bool
             ) -> tuple[bool, list[list[Claimed]], bool]:
        """Record ``answers``, fan out new events (if ``fan``), claim what the free senders can take.

        Whether to go round again at once, the deliveries to send, and whether the fan-out
        reached the feed's end. With nothing to record, a read decides first whether
        anything is to be done: an idle turn writes nothing.
        """
        free = SENDERS - self._in_flight
        if not answers:
            if not fan:
                return False, [], True
            new_events, due = self.database.run(lambda conn: deliveries.work(conn, now))
            if not new_events and not (due and free > 0):
                return False, [], True

        outcomes, fanned, claimed = self.database.run(
            functools.partial(deliveries.turn, answers=answers, now=now, fan=fan, free=free), write=True)
        for answer, outcome in zip(answers, outcomes, strict=True):
            if outcome == deliveries.UNTRIED:
                continue
            metrics.webhook_delivered(outcome)
            if outcome != deliveries.SENT:
                log.info("webhook %d delivery %d (event %d) %s: %s", answer.claimed.webhook_id, answer.claimed.id,
                         answer.claimed.event_id, outcome,
                         f"answered {answer.status}" if answer.status is not None else answer.error)
        return bool(answers or fanned.made or fanned.more or claimed), claimed, not fanned.more

    def _send(self, run: list[Claimed]) -> None:
        # One after another, in feed order; a failure stops the run (the receiver hears of
        # nothing newer until it has this one) and the rest go back untried.
        answers: list[deliveries.Answer] = []
        started = time.monotonic()
        for claimed in run:
            # A slow receiver's run ends well inside its lease, or another sender would send it again.
            if (answers and not answers[-1].sent) or time.monotonic() - started > RUN_BUDGET_S:
                answers.append(deliveries.Answer(claimed, None, None, dt.datetime.now(dt.UTC), tried=False))
                continue
            try:
                status, error = self.post(claimed)
            except Exception as exc:  # noqa: BLE001 - a bug here must not lose the answer: it is a failed try
                log.warning("webhook delivery %d failed", claimed.id, exc_info=True)
                status, error = None, f"{type(exc).__name__}: {exc}"
            answers.append(deliveries.Answer(claimed, status, error, dt.datetime.now(dt.UTC)))
        self._answers.put(answers)
        self._woken.set()

    def post(self, claimed: Claimed) -> tuple[int | None, str | None]:
        """POST one delivery: the receiver's status (None: no answer) and, unless 2xx, why it failed."""
        event = claimed.event
        payload = body(claimed, event, self.settings.public_url)
        return self._receivers.post(claimed.url, payload, headers(claimed, event, payload))


def init_app(app: Flask, database: Database, settings: Settings) -> None:
    """Give ``app`` a dispatcher, started in each process at its first request (at boot under gunicorn)."""
    dispatcher = Dispatcher(database, settings, fanout.get_hub(app))
    app.extensions["collector.webhooks"] = dispatcher
    keep_running(app, dispatcher.thread)


def get_dispatcher(app: Flask) -> Dispatcher:
    """The dispatcher of ``app``."""
    dispatcher: Dispatcher = app.extensions["collector.webhooks"]
    return dispatcher


