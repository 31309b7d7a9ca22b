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
from sqlalchemy import Select
from sqlalchemy import bindparam
from sqlalchemy import delete
from sqlalchemy import exists
from sqlalchemy import func
from sqlalchemy import literal_column
from sqlalchemy import or_
from sqlalchemy import select
from sqlalchemy import union_all
from sqlalchemy import update
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from collector.contract import StreamEvent
from collector.models import JobEvent
from collector.models import WebhookCursor
from collector.models import WebhookDelivery
from collector.store import deliveries_pg
from collector.store import event_ids
from collector.store import streams
from collector.store.core import table
from collector.store.identity import JOBS
from collector.store.identity import is_postgres
from collector.store.identity import wire_cluster
from collector.store.pg_driver import Query
from collector.store.pg_driver import execute_all
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


@dataclasses.dataclass(frozen=True)
class FanOut:
    """What one fan-out did: the deliveries it made, and whether it stopped at a full batch (more wait)."""

    made: int = 0
    more: bool = False


def fan_out(conn: Connection, now: dt.datetime) -> FanOut:
    """Make the deliveries of the feed's next ``FAN_OUT_BATCH`` events for the subscriptions they match.

    One process at a time: on PostgreSQL the cursor row's lock is skipped by the others
    (they make none this time); on SQLite the write transaction already admits one.
    """
    if is_postgres(conn):
        query = _fan_out_query(now)
        execute_all(conn, [query], commit=False)
        return _fanned(query)
    position = conn.execute(select(CURSOR.c.position).where(CURSOR.c.id == 1)).scalar()
    if position is None:
        return FanOut()
    events = conn.execute(select(EVENTS.c.id, EVENTS.c.status, JOBS.c.cluster).join(JOBS, JOBS.c.id == EVENTS.c.job_pk)
                          .where(EVENTS.c.id > position).order_by(EVENTS.c.id).limit(FAN_OUT_BATCH)).all()
    if not events:
        return FanOut()
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
        conn.execute(sqlite_insert(DELIVERIES).on_conflict_do_nothing(index_elements=["webhook_id", "event_id"]), rows)
    conn.execute(update(CURSOR).where(CURSOR.c.id == 1).values(position=events[-1].id))
    return FanOut(len(rows), len(events) == FAN_OUT_BATCH)


def _fan_out_query(now: dt.datetime) -> Query:
    return Query(deliveries_pg.FAN_OUT, {"now": now, "batch": FAN_OUT_BATCH})


def _fanned(query: Query) -> FanOut:
    if not query.rows:
        return FanOut()
    return FanOut(int(query.rows[0]["made"]), query.rows[0]["events"] == FAN_OUT_BATCH)


# A subscription's oldest pending delivery: the only one that may go (receivers hear in feed
# order). One probe of the partial index on pending rows per subscription, however many wait
# behind a receiver that is down; the state is a literal so the index matches. SQLite's
# claim; PostgreSQL's is deliveries_pg.CLAIM, the same in one statement.
_QUEUED = DELIVERIES.alias("queued")
_OLDEST = (select(_QUEUED.c.id).where(_QUEUED.c.webhook_id == WEBHOOKS.c.id,
                                      _QUEUED.c.state == literal_column("'pending'"))
           .order_by(_QUEUED.c.event_id).limit(1).correlate(WEBHOOKS).scalar_subquery())
_NOW = bindparam("now", type_=DELIVERIES.c.next_attempt_at.type)
# Still to go, its time has come and no sender holds it (checked on the row itself too: see
# deliveries_pg.CLAIM).
_DUE_CONDITION = (DELIVERIES.c.state == PENDING, DELIVERIES.c.next_attempt_at <= _NOW,
                  or_(DELIVERIES.c.claimed_until.is_(None), DELIVERIES.c.claimed_until <= _NOW))
_DUE = (select(DELIVERIES.c.id, DELIVERIES.c.webhook_id, DELIVERIES.c.event_id, DELIVERIES.c.attempts)
        .select_from(WEBHOOKS).join(DELIVERIES, DELIVERIES.c.id == _OLDEST).where(*_DUE_CONDITION))
_CLAIMABLE = _DUE.order_by(DELIVERIES.c.id).limit(bindparam("limit"))
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
    if is_postgres(conn):
        query = _claim_query(now, limit, run)
        execute_all(conn, [query], commit=False)
        return _runs(conn, query)
    heads = conn.execute(_CLAIMABLE, {"now": now, "limit": limit}).all()
    if not heads:
        return []
    ids = [head.id for head in heads]
    if run > 1 and (untried := [h for h in heads if h.attempts == 0]):
        # The same index range per head as one UNION ALL (one process, a few subscriptions).
        queues = [select(DELIVERIES.c.id).where(DELIVERIES.c.webhook_id == h.webhook_id,
                                                 DELIVERIES.c.state == PENDING, DELIVERIES.c.event_id > h.event_id)
                  .order_by(DELIVERIES.c.event_id).limit(run - 1).subquery() for h in untried]
        ids += conn.execute(union_all(*(select(queue.c.id) for queue in queues))).scalars()
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


def _claim_query(now: dt.datetime, limit: int, run: int = RUN) -> Query:
    return Query(deliveries_pg.CLAIM, {"now": now, "limit": limit, "more": run - 1, "until": now + LEASE})


def _runs(conn: Connection, query: Query) -> list[list[Claimed]]:
    """The runs deliveries_pg.CLAIM returned, by subscription; deletes the deliveries whose event is gone."""
    runs: dict[int, list[Claimed]] = {}
    gone = []
    for row in query.rows or []:
        if row["id"] is None:
            # Only when events were deleted without the foreign keys' cascade: nothing to send.
            gone.append(row["delivery_id"])
            continue
        for name, value in row.items():
            if isinstance(value, dt.datetime):
                row[name] = value.astimezone(dt.UTC)  # as SQLAlchemy's UTCDateTime gives them
        runs.setdefault(row["webhook_id"], []).append(Claimed(
            row["delivery_id"], row["webhook_id"], row["event_id"], row["attempts"], row["delivery_created_at"],
            row["url"], row["secret"], row["format"], event=streams.event_of(row)))
    if gone:
        conn.execute(delete(DELIVERIES).where(DELIVERIES.c.id.in_(gone)))
    return list(runs.values())


def _work_probe(*, below_horizon: bool) -> Select[bool, bool]:
    position = select(CURSOR.c.position).where(CURSOR.c.id == 1).scalar_subquery()
    newer = select(EVENTS.c.id).where(EVENTS.c.id > position)
    if below_horizon:
        newer = newer.where(EVENTS.c.id < event_ids.HORIZON)
    return select(exists(newer), exists(_DUE))


# Built once per backend: every process runs the probe at every poll.
_WORK = {True: _work_probe(below_horizon=True), False: _work_probe(below_horizon=False)}


def work(conn: Connection, now: dt.datetime) -> tuple[bool, bool]:
    """Whether there are events to fan out, and deliveries due: a read, so an idle tick writes nothing."""
    row = conn.execute(_WORK[is_postgres(conn)], {"now": now}).one()
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
    if is_postgres(conn):
        if queries := _recorded(answers):
            execute_all(conn, queries, commit=False)
    else:
        for status, ids, at in _sent_groups(answers):
            conn.execute(_SENT, {"ids": ids, "at": at, "status": status})
        if untried := _untried(answers):
            conn.execute(_LEASE, {"ids": untried, "until": None})  # released: the lease ends now
    return [UNTRIED if not answer.tried else SENT if answer.sent else _failed(conn, answer) for answer in answers]


def _sent_groups(answers: list[Answer]) -> list[tuple[int | None, list[int], dt.datetime]]:
    """The 2xx answers by status code: (status, delivery ids, the latest answer's time)."""
    sent: dict[int | None, list[Answer]] = {}
    for answer in answers:
        if answer.sent:
            sent.setdefault(answer.status, []).append(answer)
    return [(status, [a.claimed.id for a in group], max(a.at for a in group)) for status, group in sent.items()]


def _untried(answers: list[Answer]) -> list[int]:
    return [answer.claimed.id for answer in answers if not answer.tried]


def _recorded(answers: list[Answer]) -> list[Query]:
    """PostgreSQL's statements recording the 2xx and untried ``answers`` (failures are ``_failed``'s)."""
    queries = [Query(deliveries_pg.SENT, {"ids": deliveries_pg.id_array(ids), "at": at, "status": status})
               for status, ids, at in _sent_groups(answers)]
    if untried := _untried(answers):
        queries.append(Query(deliveries_pg.RELEASE, {"ids": deliveries_pg.id_array(untried)}))
    return queries


def turn(conn: Connection, answers: list[Answer], now: dt.datetime, *, fan: bool, free: int
         ) -> tuple[list[str], FanOut, list[list[Claimed]]]:
    """The delivery loop's transaction: ``finish`` the answers, ``fan_out`` (if ``fan``), ``claim`` for ``free``.

    The answers' outcomes, what the fan-out did, and the runs claimed. On
    PostgreSQL one round trip, COMMIT included, unless an answer failed: its record (a 410
    kills its subscription's pending deliveries) must follow the sent ones before it.
    """
    if not is_postgres(conn):
        return (finish(conn, answers), fan_out(conn, now) if fan else FanOut(),
                claim(conn, now, free) if free > 0 else [])
    if all(answer.sent or not answer.tried for answer in answers):
        queries = _recorded(answers)
        outcomes = [SENT if answer.sent else UNTRIED for answer in answers]
    else:
        queries, outcomes = [], finish(conn, answers)
    fanning = _fan_out_query(now) if fan else None
    claiming = _claim_query(now, free) if free > 0 else None
    queries += [query for query in (fanning, claiming) if query is not None]
    if queries:
        execute_all(conn, queries, commit=True)
    return outcomes, _fanned(fanning) if fanning else FanOut(), _runs(conn, claiming) if claiming else []


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
