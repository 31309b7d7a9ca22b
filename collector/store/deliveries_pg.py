"""The delivery loop's statements on PostgreSQL, as fixed text sent straight to libpq (store/pg_driver.py).

A turn of the loop (record the answers, fan out, claim) took a dozen statements through
SQLAlchemy, and their Python cost more than the work they asked of the server
(docs/performance.md, "Webhooks"). Each step is one statement here, and a turn sends them
all, with BEGIN and COMMIT, in one round trip. store/deliveries.py holds the rules; these
are the same rules in SQL, and SQLite runs the SQLAlchemy versions beside them (the tests
run both).
"""

from __future__ import annotations

from collector.store.jobs import SUMMARY_COLUMNS
from collector.store.pg_driver import statement

# A 2xx: sent, whatever the state it was leased in (one UPDATE per status code).
SENT = statement("collector_delivery_sent", """
UPDATE webhook_deliveries
SET state = 'sent', sent_at = %(at)s, attempts = attempts + 1, last_status = %(status)s, last_error = NULL,
    claimed_until = NULL
WHERE id = ANY(CAST(%(ids)s AS bigint[])) AND state = 'pending'
""")

# Never tried (its run stopped before it): back to the queue at once.
RELEASE = statement("collector_delivery_release",
                    "UPDATE webhook_deliveries SET claimed_until = NULL WHERE id = ANY(CAST(%(ids)s AS bigint[]))")

# The feed's next settled events, each made into a delivery per subscription it matches
# (status listed, cluster listed or none listed; the unknown cluster '' matches only
# those), and the cursor moved past them: deliveries.fan_out. The cursor row is skipped
# when another process holds it: that one is fanning out. The position is a scalar
# subquery, not a join: as a join condition it bounded no index scan, and each fan-out
# read the whole feed from its first event (80 ms per turn at 100,000 events).
FAN_OUT = statement("collector_delivery_fan_out", """
WITH cursor AS (SELECT position FROM webhook_cursor WHERE id = 1 FOR UPDATE SKIP LOCKED),
events AS (
    SELECT e.id, e.status, j.cluster
    FROM job_events e JOIN jobs j ON j.id = e.job_pk
    WHERE e.id > (SELECT position FROM cursor) AND e.id < collector_feed_horizon()
    ORDER BY e.id LIMIT %(batch)s
),
made AS (
    INSERT INTO webhook_deliveries (webhook_id, event_id, state, attempts, created_at, next_attempt_at)
    SELECT w.id, events.id, 'pending', 0, %(now)s, %(now)s
    FROM events JOIN webhooks w
        ON w.enabled AND events.id > w.start_after AND w.statuses ? events.status
        AND (w.clusters = '[]'::jsonb OR (events.cluster <> '' AND w.clusters ? events.cluster))
    ORDER BY events.id, w.id
    ON CONFLICT (webhook_id, event_id) DO NOTHING
    RETURNING 1
),
moved AS (
    UPDATE webhook_cursor SET position = (SELECT max(id) FROM events) WHERE id = 1 AND EXISTS (SELECT FROM events)
)
SELECT (SELECT count(*) FROM events) AS events, (SELECT count(*) FROM made) AS made
""")

# deliveries.claim: each subscription's oldest pending delivery that is due and not held
# (locked, so two senders never take one), plus up to ``more`` queued behind it when it
# was never tried; leased; returned with where to send them, the event and its job now.
# An event deleted without the foreign key's cascade leaves its delivery with no event.
# The head is found in the statement's snapshot but locked as it is now: another sender
# may have leased, sent and recorded it in between, so its state is checked again on the
# locked row (d.state), or it would go out twice (tests/test_webhook_delivery.py).
CLAIM = statement("collector_delivery_claim", f"""
WITH heads AS (
    SELECT d.id, d.webhook_id, d.event_id, d.attempts
    FROM webhooks w JOIN webhook_deliveries d ON d.id = (
        SELECT q.id FROM webhook_deliveries q WHERE q.webhook_id = w.id AND q.state = 'pending'
        ORDER BY q.event_id LIMIT 1)
    WHERE d.state = 'pending' AND d.next_attempt_at <= %(now)s
        AND (d.claimed_until IS NULL OR d.claimed_until <= %(now)s)
    ORDER BY d.id LIMIT %(limit)s
    FOR UPDATE OF d SKIP LOCKED
),
taken AS (
    SELECT id FROM heads
    UNION ALL
    SELECT queued.id FROM heads CROSS JOIN LATERAL (
        SELECT q.id FROM webhook_deliveries q
        WHERE q.webhook_id = heads.webhook_id AND q.state = 'pending' AND q.event_id > heads.event_id
        ORDER BY q.event_id LIMIT %(more)s
    ) AS queued
    WHERE heads.attempts = 0
),
leased AS (
    UPDATE webhook_deliveries d SET claimed_until = %(until)s FROM taken WHERE d.id = taken.id AND d.state = 'pending'
    RETURNING d.id, d.webhook_id, d.event_id, d.attempts, d.created_at
)
SELECT leased.id AS delivery_id, leased.webhook_id, leased.event_id, leased.attempts,
       leased.created_at AS delivery_created_at, w.url, w.secret, w.format,
       e.id, e.status AS event_status, e.stage AS event_stage, e.message AS event_message,
       e.created_at AS event_created_at, e.credential, {", ".join(f"j.{name}" for name in SUMMARY_COLUMNS)}
FROM leased JOIN webhooks w ON w.id = leased.webhook_id
LEFT JOIN job_events e ON e.id = leased.event_id
LEFT JOIN jobs j ON j.id = e.job_pk
ORDER BY leased.webhook_id, leased.event_id
""")


def id_array(ids: list[int]) -> str:
    """``ids`` as an array literal's text, for ``CAST(... AS bigint[])``."""
    return "{" + ",".join(str(int(i)) for i in ids) + "}"
