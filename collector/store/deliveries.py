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
from typing import Any

from sqlalchemy import Connection
from sqlalchemy import bindparam
from sqlalchemy import delete
from sqlalchemy import exists
from sqlalchemy import func
from sqlalchemy import literal_column
from sqlalchemy import or_
from sqlalchemy import select
from sqlalchemy import text
from sqlalchemy import union_all
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
UNTRIED = "untried"  # ... and for one released untried, its run having stopped before it
# Retries back off from 1 s, doubling, up to 10 minutes apart, for a day.
FIRST_RETRY_S = 1.0
LONGEST_RETRY_S = 600.0
GIVE_UP_AFTER = dt.timedelta(hours=24)
# Longer than a receiver may take (5 s to connect, 10 s to answer) and the work around
# it: past it, another sender may send the delivery again (its first sender died). A
# subscription's later deliveries wait behind it that long.
LEASE = dt.timedelta(seconds=30)
FAN_OUT_BATCH = 500
# At most this many deliveries of one subscription go to one sender at a time.
RUN = 20
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


@dataclasses.dataclass(frozen=True)
class Answer:
    """What came of one try: the receiver's status (None: no answer) and why it failed, at ``at``."""

    claimed: Claimed
    status: int | None
    error: str | None
    at: dt.datetime
    tried: bool = True  # False: its run stopped before it (an earlier one failed); it is released

    @property
    def sent(self) -> bool:
        """Whether the receiver took it (a 2xx)."""
        return self.tried and self.status is not None and 200 <= self.status < 300


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
    # Events come in few (status, cluster) kinds: each kind's subscriptions are found once.
    kinds: dict[tuple[str, str], list[Any]] = {}
    for event in events:
        if (event.status, event.cluster) not in kinds:
            cluster = wire_cluster(event.cluster)
            kinds[event.status, event.cluster] = [hook for hook in hooks if event.status in hook.statuses
                                                  and (not hook.clusters or cluster in hook.clusters)]
    rows = [
        {"webhook_id": hook.id, "event_id": event.id, "state": PENDING, "attempts": 0, "created_at": now,
         "next_attempt_at": now}
        for event in events for hook in kinds[event.status, event.cluster] if event.id > hook.start_after
    ]
    if rows:
        insert = (pg_insert if is_postgres(conn) else sqlite_insert)(DELIVERIES)
        conn.execute(insert.on_conflict_do_nothing(index_elements=["webhook_id", "event_id"]), rows)
    conn.execute(update(CURSOR).where(CURSOR.c.id == 1).values(position=events[-1].id))
    return len(rows)


# A subscription's oldest pending delivery: the only one that may go (receivers hear in feed
# order). One probe of the partial index on pending rows per subscription, however many wait
# behind a receiver that is down; the state is a literal so PostgreSQL matches that index.
_QUEUED = DELIVERIES.alias("queued")
_OLDEST = (select(_QUEUED.c.id).where(_QUEUED.c.webhook_id == WEBHOOKS.c.id,
                                      _QUEUED.c.state == literal_column("'pending'"))
           .order_by(_QUEUED.c.event_id).limit(1).correlate(WEBHOOKS).scalar_subquery())
_NOW = bindparam("now", type_=DELIVERIES.c.next_attempt_at.type)
# Its time has come and no sender holds it.
_DUE_CONDITION = (DELIVERIES.c.next_attempt_at <= _NOW,
                  or_(DELIVERIES.c.claimed_until.is_(None), DELIVERIES.c.claimed_until <= _NOW))
_DUE = (select(DELIVERIES.c.id, DELIVERIES.c.webhook_id, DELIVERIES.c.event_id, DELIVERIES.c.attempts)
        .select_from(WEBHOOKS).join(DELIVERIES, DELIVERIES.c.id == _OLDEST).where(*_DUE_CONDITION))
_CLAIMABLE = _DUE.order_by(DELIVERIES.c.id).limit(bindparam("limit"))
_CLAIMABLE_LOCKED = _CLAIMABLE.with_for_update(of=DELIVERIES, skip_locked=True)


# The deliveries queued behind each head, in feed order, at most ``more`` per subscription:
# one index range each. One constant statement on PostgreSQL (its plan is prepared once).
_FOLLOWERS_PG = text("""
SELECT queued.id FROM unnest(CAST(:webhooks AS integer[]), CAST(:afters AS bigint[])) AS head(webhook_id, event_id)
CROSS JOIN LATERAL (
    SELECT d.id FROM webhook_deliveries d
    WHERE d.webhook_id = head.webhook_id AND d.state = 'pending' AND d.event_id > head.event_id
    ORDER BY d.event_id LIMIT :more
) AS queued
""")


def _followers_of(conn: Connection, heads: list[Any], more: int) -> list[int]:
    """The ids of up to ``more`` deliveries queued behind each of ``heads``: they go in its run."""
    if is_postgres(conn):
        params = {"webhooks": [h.webhook_id for h in heads], "afters": [h.event_id for h in heads], "more": more}
        return list(conn.execute(_FOLLOWERS_PG, params).scalars())
    # SQLite (one process, a few subscriptions): the same ranges as one UNION ALL.
    queues = [select(DELIVERIES.c.id).where(DELIVERIES.c.webhook_id == h.webhook_id, DELIVERIES.c.state == PENDING,
                                             DELIVERIES.c.event_id > h.event_id)
              .order_by(DELIVERIES.c.event_id).limit(more).subquery() for h in heads]
    return list(conn.execute(union_all(*(select(queue.c.id) for queue in queues))).scalars())


_LEASE = (update(DELIVERIES).where(DELIVERIES.c.id.in_(bindparam("ids", expanding=True)))
          .values(claimed_until=bindparam("until", type_=DELIVERIES.c.claimed_until.type)))
_CLAIMED = (select(DELIVERIES.c.id, DELIVERIES.c.webhook_id, DELIVERIES.c.event_id, DELIVERIES.c.attempts,
                   DELIVERIES.c.created_at, WEBHOOKS.c.url, WEBHOOKS.c.secret, WEBHOOKS.c.format)
            .join(WEBHOOKS, WEBHOOKS.c.id == DELIVERIES.c.webhook_id)
            .where(DELIVERIES.c.id.in_(bindparam("ids", expanding=True)))
            .order_by(DELIVERIES.c.webhook_id, DELIVERIES.c.event_id))


def claim(conn: Connection, now: dt.datetime, limit: int, run: int = RUN) -> list[list[Claimed]]:
    """Take the due deliveries of up to ``limit`` subscriptions for ``LEASE``, with their events, as runs.

    A run is one subscription's oldest pending delivery and, when it was never tried (its
    receiver is not known to fail), up to ``run`` - 1 more queued behind it, in feed order:
    one sender sends them one after another. No other sender gets them meanwhile.
    """
    due = _CLAIMABLE_LOCKED if is_postgres(conn) else _CLAIMABLE
    heads = conn.execute(due, {"now": now, "limit": limit}).all()
    if not heads:
        return []
    ids = [head.id for head in heads]
    if run > 1 and (untried := [h for h in heads if h.attempts == 0]):
        ids += _followers_of(conn, untried, run - 1)
    conn.execute(_LEASE, {"ids": ids, "until": now + LEASE})
    rows = conn.execute(_CLAIMED, {"ids": ids}).all()
    # Read here, in the claim's transaction, so a send needs no read of its own.
    found = streams.by_id(conn, [row.event_id for row in rows])
    if gone := [row.id for row in rows if row.event_id not in found]:
        # Only when events were deleted without the foreign keys' cascade: nothing to send.
        conn.execute(delete(DELIVERIES).where(DELIVERIES.c.id.in_(gone)))
    runs: dict[int, list[Claimed]] = {}
    for row in rows:
        if row.event_id in found:
            runs.setdefault(row.webhook_id, []).append(Claimed(*row, event=found[row.event_id]))
    return list(runs.values())


def work(conn: Connection, now: dt.datetime) -> tuple[bool, bool]:
    """Whether there are events to fan out, and deliveries due: a read, so an idle tick writes nothing."""
    position = select(CURSOR.c.position).where(CURSOR.c.id == 1).scalar_subquery()
    newer = select(EVENTS.c.id).where(EVENTS.c.id > position)
    if (settled := event_ids.below_horizon(conn, EVENTS.c.id)) is not None:
        newer = newer.where(settled)
    row = conn.execute(select(exists(newer), exists(_DUE)), {"now": now}).one()
    return bool(row[0]), bool(row[1])


def retry_delay(attempts: int) -> float:
    """Seconds before the next try after ``attempts`` failed ones: 1, 2, 4, ... up to 600."""
    return float(min(LONGEST_RETRY_S, FIRST_RETRY_S * 2 ** (attempts - 1)))


def _failed(conn: Connection, answer: Answer) -> str:
    """Record an answer other than a 2xx; the outcome: retried or dead.

    410 Gone kills it and disables the subscription (its other pending deliveries die with
    it). Anything else tries again later, until a day has passed.
    """
    claimed, now = answer.claimed, answer.at
    error = None if answer.error is None else answer.error[:_ERROR_CHARS]
    mine = update(DELIVERIES).where(DELIVERIES.c.id == claimed.id, DELIVERIES.c.state == PENDING)
    done = {"attempts": claimed.attempts + 1, "last_status": answer.status, "last_error": error,
            "claimed_until": None}
    if answer.status == 410:
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
    conn.execute(mine.values(next_attempt_at=now + dt.timedelta(seconds=retry_delay(claimed.attempts + 1)),
                             **done))
    return RETRIED


_SENT = (update(DELIVERIES)
         .where(DELIVERIES.c.id.in_(bindparam("ids", expanding=True)), DELIVERIES.c.state == PENDING)
         .values(state=SENT, sent_at=bindparam("at", type_=DELIVERIES.c.sent_at.type),
                 attempts=DELIVERIES.c.attempts + 1, last_status=bindparam("status"), last_error=None,
                 claimed_until=None))


def finish(conn: Connection, answers: list[Answer]) -> list[str]:
    """Record receivers' answers; each one's outcome (sent, retried or dead), in order.

    A 2xx sends it: one UPDATE per status code however many there are (their ``sent_at``
    is the latest answer's among them: a batch is milliseconds wide). 410 Gone kills it and
    disables the subscription; anything else retries later (``_failed``). One never tried
    goes back to the queue at once, for the next claim.
    """
    sent: dict[int | None, list[Answer]] = {}
    for answer in answers:
        if answer.sent:
            sent.setdefault(answer.status, []).append(answer)
    if untried := [answer.claimed.id for answer in answers if not answer.tried]:
        conn.execute(_LEASE, {"ids": untried, "until": None})  # released: the lease ends now
    for status, group in sent.items():
        conn.execute(_SENT, {"ids": [a.claimed.id for a in group], "at": max(a.at for a in group), "status": status})
    return [UNTRIED if not answer.tried else SENT if answer.sent else _failed(conn, answer) for answer in answers]


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
