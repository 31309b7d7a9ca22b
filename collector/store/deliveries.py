"""Webhook deliveries: made from the event feed, claimed by a sender for a while, ended by the receiver's answer.

The event row is the outbox. Every event is written in its job's transaction, and the
feed never skips one (store/event_ids.py), so ``fan_out`` turning the feed into delivery
rows, and moving the cursor in the same transaction, loses none whichever process dies
when: what was not fanned out is fanned out again, and a delivery exists once per
(subscription, event) whatever repeats. Writes pay nothing for subscriptions.

A delivery leaves only after every older one of its subscription has left (sent or
dead), so each receiver hears of events in feed order. A sender holds a delivery by a
lease, not a row lock: a lock held across an HTTP request would keep a write
transaction open, and with it the feed horizon, for as long as a receiver takes.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from sqlalchemy import ColumnElement
from sqlalchemy import Connection
from sqlalchemy import and_
from sqlalchemy import delete
from sqlalchemy import exists
from sqlalchemy import func
from sqlalchemy import or_
from sqlalchemy import select
from sqlalchemy import update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from collector.contract import StreamEvent
from collector.models import JobEvent
from collector.models import WebhookCursor
from collector.models import WebhookDelivery
from collector.store import event_ids
from collector.store import streams
from collector.store.core import table
from collector.store.identity import JOBS
from collector.store.identity import is_postgres
from collector.store.identity import wire_cluster
from collector.store.webhooks import WEBHOOKS
from collector.webhook_contract import JobDelivery

DELIVERIES = table(WebhookDelivery)
CURSOR = table(WebhookCursor)
EVENTS = table(JobEvent)
PENDING, SENT, DEAD = "pending", "sent", "dead"
RETRIED = "retried"  # what finish() reports for a delivery that stays pending
# Retries back off from 1 s, doubling, up to 10 minutes apart, for a day.
FIRST_RETRY_S = 1.0
LONGEST_RETRY_S = 600.0
GIVE_UP_AFTER = dt.timedelta(hours=24)
# Longer than a receiver may take (5 s to connect, 10 s to answer) and the work around
# it: past it, another sender may send the delivery again (its first sender died). A
# subscription's later deliveries wait behind it that long.
LEASE = dt.timedelta(seconds=30)
FAN_OUT_BATCH = 500
_ERROR_CHARS = 500


@dataclasses.dataclass(frozen=True)
class Claimed:
    """A delivery a sender holds, with where and how to send it."""

    id: int
    webhook_id: int
    event_id: int
    attempts: int
    created_at: dt.datetime
    url: str
    secret: str | None
    format: str
    event: StreamEvent  # with its job as it is now


def fan_out(conn: Connection, now: dt.datetime) -> int:
    """Make the deliveries of the feed's next events for the subscriptions they match; how many were made.

    One process at a time: on PostgreSQL the cursor row's lock is skipped by the others
    (they make none this time); on SQLite the write transaction already admits one.
    """
    cursor = select(CURSOR.c.position).where(CURSOR.c.id == 1)
    position = conn.execute(cursor.with_for_update(skip_locked=True) if is_postgres(conn) else cursor).scalar()
    if position is None:
        return 0
    query = (select(EVENTS.c.id, EVENTS.c.status, JOBS.c.cluster).join(JOBS, JOBS.c.id == EVENTS.c.job_pk)
             .where(EVENTS.c.id > position))
    if (settled := event_ids.below_horizon(conn, EVENTS.c.id)) is not None:
        query = query.where(settled)
    events = conn.execute(query.order_by(EVENTS.c.id).limit(FAN_OUT_BATCH)).all()
    if not events:
        return 0
    hooks = conn.execute(select(WEBHOOKS.c.id, WEBHOOKS.c.statuses, WEBHOOKS.c.clusters, WEBHOOKS.c.start_after)
                         .where(WEBHOOKS.c.enabled)).all()
    rows = [
        {"webhook_id": hook.id, "event_id": event.id, "state": PENDING, "attempts": 0, "created_at": now,
         "next_attempt_at": now}
        for event in events for hook in hooks
        if event.id > hook.start_after and event.status in hook.statuses
        and (not hook.clusters or wire_cluster(event.cluster) in hook.clusters)
    ]
    if rows:
        insert = (pg_insert if is_postgres(conn) else sqlite_insert)(DELIVERIES)
        conn.execute(insert.on_conflict_do_nothing(index_elements=["webhook_id", "event_id"]), rows)
    conn.execute(update(CURSOR).where(CURSOR.c.id == 1).values(position=events[-1].id))
    return len(rows)


_OLDER = DELIVERIES.alias("older")
_DUE = (
    select(DELIVERIES.c.id)
    # Nothing older of the same subscription still to go: receivers hear in feed order.
    .where(~exists().where(_OLDER.c.webhook_id == DELIVERIES.c.webhook_id, _OLDER.c.state == PENDING,
                           _OLDER.c.event_id < DELIVERIES.c.event_id))
    .order_by(DELIVERIES.c.id)
)


def _due_at(now: dt.datetime) -> ColumnElement[bool]:
    """A pending delivery's own condition to go at ``now``: its time has come and no sender holds it."""
    return and_(DELIVERIES.c.state == PENDING, DELIVERIES.c.next_attempt_at <= now,
                or_(DELIVERIES.c.claimed_until.is_(None), DELIVERIES.c.claimed_until <= now))


def claim(conn: Connection, now: dt.datetime, limit: int, *, webhook_id: int | None = None) -> list[Claimed]:
    """Take up to ``limit`` deliveries that are due (of one subscription, if given) for ``LEASE``, with their events.

    No other sender gets them meanwhile. A subscription has at most one due at a time.
    """
    due = _DUE.where(_due_at(now)).limit(limit)
    if webhook_id is not None:
        due = due.where(DELIVERIES.c.webhook_id == webhook_id)
    if is_postgres(conn):
        due = due.with_for_update(of=DELIVERIES, skip_locked=True)
    ids = list(conn.execute(due).scalars())
    if not ids:
        return []
    conn.execute(update(DELIVERIES).where(DELIVERIES.c.id.in_(ids)).values(claimed_until=now + LEASE))
    rows = conn.execute(
        select(DELIVERIES.c.id, DELIVERIES.c.webhook_id, DELIVERIES.c.event_id, DELIVERIES.c.attempts,
               DELIVERIES.c.created_at, WEBHOOKS.c.url, WEBHOOKS.c.secret, WEBHOOKS.c.format)
        .join(WEBHOOKS, WEBHOOKS.c.id == DELIVERIES.c.webhook_id)
        .where(DELIVERIES.c.id.in_(ids)).order_by(DELIVERIES.c.id)
    ).all()
    # Read here, in the claim's transaction, so a send needs no read of its own.
    found = streams.by_id(conn, [row.event_id for row in rows])
    if gone := [row.id for row in rows if row.event_id not in found]:
        # Only when events were deleted without the foreign keys' cascade: nothing to send.
        conn.execute(delete(DELIVERIES).where(DELIVERIES.c.id.in_(gone)))
    return [Claimed(*row, event=found[row.event_id]) for row in rows if row.event_id in found]


def work(conn: Connection, now: dt.datetime) -> tuple[bool, bool]:
    """Whether there are events to fan out, and deliveries due: a read, so an idle tick writes nothing."""
    position = select(CURSOR.c.position).where(CURSOR.c.id == 1).scalar_subquery()
    newer = select(EVENTS.c.id).where(EVENTS.c.id > position)
    if (settled := event_ids.below_horizon(conn, EVENTS.c.id)) is not None:
        newer = newer.where(settled)
    row = conn.execute(select(exists(newer), exists(select(DELIVERIES.c.id).where(_due_at(now))))).one()
    return bool(row[0]), bool(row[1])


def retry_delay(attempts: int) -> float:
    """Seconds before the next try after ``attempts`` failed ones: 1, 2, 4, ... up to 600."""
    return float(min(LONGEST_RETRY_S, FIRST_RETRY_S * 2 ** (attempts - 1)))


def finish(conn: Connection, claimed: Claimed, status: int | None, error: str | None, now: dt.datetime) -> str:
    """Record the receiver's answer (``status`` None: none came); the outcome: sent, retried or dead.

    A 2xx sends it. 410 Gone kills it and disables the subscription (its other pending
    deliveries die with it). Anything else tries again later, until a day has passed.
    """
    attempts = claimed.attempts + 1
    error = None if error is None else error[:_ERROR_CHARS]
    mine = update(DELIVERIES).where(DELIVERIES.c.id == claimed.id, DELIVERIES.c.state == PENDING)
    done = {"attempts": attempts, "last_status": status, "last_error": error, "claimed_until": None}
    if status is not None and 200 <= status < 300:
        conn.execute(mine.values(state=SENT, sent_at=now, **done))
        return SENT
    if status == 410:
        reason = f"the receiver answered 410 Gone at {now.isoformat(timespec='seconds')}"
        conn.execute(update(WEBHOOKS).where(WEBHOOKS.c.id == claimed.webhook_id)
                     .values(enabled=False, disabled_reason=reason))
        conn.execute(mine.values(state=DEAD, **done))
        conn.execute(update(DELIVERIES).where(DELIVERIES.c.webhook_id == claimed.webhook_id,
                                              DELIVERIES.c.state == PENDING)
                     .values(state=DEAD, last_error="the subscription was disabled: " + reason, claimed_until=None))
        return DEAD
    if now - claimed.created_at >= GIVE_UP_AFTER:
        conn.execute(mine.values(state=DEAD, **done))
        return DEAD
    conn.execute(mine.values(next_attempt_at=now + dt.timedelta(seconds=retry_delay(attempts)), **done))
    return RETRIED


def of_job(conn: Connection, job_pk: int) -> list[JobDelivery]:
    """The deliveries of a job's events, oldest first."""
    rows = conn.execute(
        select(DELIVERIES.c.id, DELIVERIES.c.webhook_id, DELIVERIES.c.event_id, EVENTS.c.status, DELIVERIES.c.state,
               DELIVERIES.c.attempts, DELIVERIES.c.last_status, DELIVERIES.c.created_at,
               DELIVERIES.c.next_attempt_at, DELIVERIES.c.sent_at)
        .join(EVENTS, EVENTS.c.id == DELIVERIES.c.event_id)
        .where(EVENTS.c.job_pk == job_pk).order_by(DELIVERIES.c.id)
    ).all()
    return [JobDelivery(delivery_id=r.id, webhook_id=r.webhook_id, event_id=r.event_id, event_status=r.status,
                        state=r.state, attempts=r.attempts, last_status=r.last_status, created_at=r.created_at,
                        next_attempt_at=r.next_attempt_at if r.state == PENDING else None, sent_at=r.sent_at)
            for r in rows]


def pending_count(conn: Connection) -> int:
    """How many deliveries are still to go."""
    return int(conn.execute(select(func.count()).select_from(DELIVERIES).where(DELIVERIES.c.state == PENDING))
               .scalar_one())
