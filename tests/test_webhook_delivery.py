"""Webhook delivery end to end: a real collector fans its events out to real HTTP receivers."""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import hmac
import json
import threading
import time
import uuid

import pytest
from sqlalchemy import insert
from sqlalchemy import select
from sqlalchemy import text

from collector.contract import JobCreatePayload
from collector.contract import JobStatus
from collector.contract import JobUpdatePayload
from collector.db import Database
from collector.settings import Settings
from collector.store import deliveries
from collector.store import jobs as job_store
from collector.store import webhooks as webhook_store
from collector.store.identity import JOBS
from collector.webhook_contract import WebhookCreate
from tests.helpers import HANG
from tests.helpers import Recorder
from tests.helpers import put
from tests.helpers import submit
from tests.helpers import wait_for

PUBLIC = "https://collector.example"
OK = (200, {"Content-Type": "text/plain"}, b"ok")


@pytest.fixture
def api(serve):
    """A collector that looks for deliveries often, and knows where its page is."""
    return serve(write_token="w-" + uuid.uuid4().hex, read_token="r-" + uuid.uuid4().hex, webhook_poll_s=0.05,
                 public_url=PUBLIC)


def answering(*answers):
    """A receiver script: these answers in turn, then 200 for good."""
    queue = list(answers)
    return lambda request, recorder: queue.pop(0) if queue else OK


def subscribe(api, url: str, **fields) -> dict:
    response = api.post("/api/webhooks", json={"url": url, **fields})
    assert response.status_code == 201, response.text
    return response.json()


def fail(api, job_id: str, cluster: str, message: str = "OOM on node-3", exit_code: int = 1) -> None:
    assert put(api, job_id, status="failed", message=message, exit_code=exit_code,
               updated_at="2026-12-03T09:00:00Z", metadata={"cluster": cluster}).status_code == 200


def posted(receiver: Recorder, count: int, timeout: float = 10.0) -> list:
    return wait_for(lambda: receiver.of("POST") if len(receiver.of("POST")) >= count else None, timeout,
                    f"{count} deliveries")


def metric(api, line_start: str) -> float:
    """The value of the /metrics sample whose line starts with ``line_start``."""
    text = api.get("/metrics").text
    (value,) = [line.split(" ")[-1] for line in text.splitlines() if line.startswith(line_start + " ")]
    return float(value)


def state_of(database, delivery_id: int) -> tuple:
    return database.row("SELECT state, attempts, last_status FROM webhook_deliveries WHERE id = :i", i=delivery_id)


def test_a_matching_event_is_posted_once_signed_with_its_job(api, recorder, database):
    receiver = recorder(script=answering())
    hook = subscribe(api, receiver.url + "/hook", statuses=["failed"], clusters=["b200"], secret="s3cret")
    sent_before = metric(api, 'collector_webhook_deliveries_total{outcome="sent"}')
    submit(api, "j1", cluster="b200")
    submit(api, "j2", cluster="h100")
    assert put(api, "j1", status="starting", metadata={"cluster": "b200"}).status_code == 200  # not a status it wants
    fail(api, "j2", "h100")  # not a cluster it wants
    fail(api, "j1", "b200")
    (request,) = posted(receiver, 1)
    time.sleep(0.5)  # nothing else follows
    assert len(receiver.of("POST")) == 1

    delivered = json.loads(request.body)
    event_id = database.scalar("SELECT max(e.id) FROM job_events e JOIN jobs j ON j.id = e.job_pk "
                               "WHERE j.job_id = 'j1'")
    assert request.path == "/hook"
    assert request.headers["X-Collector-Signature"] == "sha256=" + hmac.new(
        b"s3cret", request.body, hashlib.sha256).hexdigest()
    assert request.headers["X-Collector-Event"] == "failed"
    assert request.headers["X-Collector-Delivery"] == str(delivered["delivery_id"])
    assert request.headers["Content-Type"] == "application/json"
    job = api.get("/api/jobs/j1", params={"cluster": "b200"}).json()
    assert delivered == {
        "delivery_id": delivered["delivery_id"], "webhook_id": hook["id"],
        "event": {"id": event_id, "job_id": "j1", "cluster": "b200", "status": "failed", "stage": None,
                  "message": "OOM on node-3", "created_at": "2026-12-03T09:00:00Z"},
        "job": {name: job[name] for name in ("job_id", "job_name", "status", "stage", "message", "cluster",
                                             "submitted_at", "started_at", "completed_at", "updated_at",
                                             "exit_code")},
        "link": f"{PUBLIC}/?job=j1&job_cluster=b200",
    }
    assert state_of(database, delivered["delivery_id"]) == ("sent", 1, 200)
    assert metric(api, 'collector_webhook_deliveries_total{outcome="sent"}') == sent_before + 1
    assert metric(api, "collector_webhook_deliveries_pending") == 0
    # What the page shows under the job: any reader may see it, never the URL.
    shown = api.get("/api/jobs/j1/deliveries", params={"cluster": "b200"}, token=api.settings.read_token)
    assert shown.status_code == 200, shown.text
    (row,) = shown.json()["deliveries"]
    assert row.pop("created_at").endswith("Z") and row.pop("sent_at").endswith("Z")
    assert shown.json()["cluster"] == "b200" and receiver.url not in shown.text
    assert row == {"delivery_id": delivered["delivery_id"], "webhook_id": hook["id"], "event_id": event_id,
                   "event_status": "failed", "state": "sent", "attempts": 1, "last_status": 200,
                   "next_attempt_at": None}
    assert api.get("/api/jobs/j2/deliveries", params={"cluster": "h100"}).json()["deliveries"] == []
    missing = api.get("/api/jobs/nope/deliveries")
    assert (missing.status_code, missing.json()["detail"]) == (404, "job nope not found")


def test_slack_gets_one_line_with_the_exit_code_and_a_link(api, recorder):
    receiver = recorder(script=answering())
    subscribe(api, receiver.url, format="slack")
    submit(api, "12345", cluster="b200")
    fail(api, "12345", "b200", message="Job failed with exit code 1")
    (request,) = posted(receiver, 1)
    assert json.loads(request.body) == {
        "text": f"b200/12345 failed (exit 1): Job failed with exit code 1 {PUBLIC}/?job=12345&job_cluster=b200"}
    assert "X-Collector-Signature" not in request.headers  # no secret, no signature


def test_a_failing_receiver_gets_the_same_delivery_again_then_the_next_in_order(api, recorder, database):
    receiver = recorder(script=answering((500, {}, b"busy"), (503, {}, b"later")))
    subscribe(api, receiver.url, statuses=["starting", "workers", "failed"])
    submit(api, "j1", cluster="b200")
    assert put(api, "j1", status="starting", metadata={"cluster": "b200"}).status_code == 200
    assert put(api, "j1", status="workers", updated_at="2026-12-03T08:30:00Z",
               metadata={"cluster": "b200"}).status_code == 200
    fail(api, "j1", "b200")
    # 1 s, then 2 s of backoff before the third try of the first event.
    requests_ = posted(receiver, 5, timeout=15)
    statuses = [json.loads(r.body)["event"]["status"] for r in requests_]
    assert statuses == ["starting", "starting", "starting", "workers", "failed"]
    first = json.loads(requests_[0].body)["delivery_id"]
    assert {r.headers["X-Collector-Delivery"] for r in requests_[:3]} == {str(first)}
    assert requests_[2].answer == (200, b"ok")
    assert state_of(database, first) == ("sent", 3, 200)
    assert database.scalar("SELECT last_error FROM webhook_deliveries WHERE id = :i", i=first) is None


def test_410_gone_disables_the_subscription(api, recorder, database):
    receiver = recorder(script=answering((410, {}, b"gone")))
    hook = subscribe(api, receiver.url)
    submit(api, "j1", cluster="b200")
    fail(api, "j1", "b200")
    posted(receiver, 1)
    listed = wait_for(lambda: [h for h in api.get("/api/webhooks").json()["webhooks"] if not h["enabled"]], 5,
                      "the subscription disabled")
    assert listed[0]["id"] == hook["id"]
    assert listed[0]["disabled_reason"].startswith("the receiver answered 410 Gone at ")
    submit(api, "j2", cluster="b200")
    fail(api, "j2", "b200")
    time.sleep(0.6)
    assert len(receiver.of("POST")) == 1
    # The subscription's one delivery, dead, with the start of what the receiver said.
    assert database.row("SELECT state, attempts, last_status, last_error FROM webhook_deliveries") == (
        "dead", 1, 410, "gone")


def test_a_hanging_receiver_does_not_delay_the_others(api, recorder):
    hanging = recorder(script=lambda request, recorder: HANG)
    healthy = recorder(script=answering())
    subscribe(api, hanging.url)
    subscribe(api, healthy.url)
    submit(api, "j1", cluster="b200")
    started = time.monotonic()
    fail(api, "j1", "b200")
    posted(healthy, 1, timeout=2)
    assert time.monotonic() - started < 2
    assert len(hanging.of("POST")) == 1
    # The healthy one's answer is recorded a moment after it arrived; the hanging one stays pending.
    assert wait_for(lambda: metric(api, "collector_webhook_deliveries_pending") == 1, 5, "only the hanging one pending")


def test_an_unreachable_receiver_is_retried_and_says_why(api, database):
    subscribe(api, "http://127.0.0.1:9/nothing-listens")
    submit(api, "j1", cluster="b200")
    fail(api, "j1", "b200")
    row = wait_for(lambda: database.row("SELECT state, attempts, last_status, last_error FROM webhook_deliveries")
                   if database.scalar("SELECT count(*) FROM webhook_deliveries WHERE attempts > 0") else None, 5,
                   "a failed attempt")
    assert row[:3] == ("pending", 1, None)
    assert row[3].startswith("ConnectionRefusedError: ") and "Connection refused" in row[3]


def test_a_subscription_hears_nothing_of_what_came_before_it_and_removing_it_drops_its_deliveries(
        api, recorder, database):
    submit(api, "old", cluster="b200")
    fail(api, "old", "b200")
    receiver = recorder(script=lambda request, recorder: HANG)
    hook = subscribe(api, receiver.url)
    submit(api, "new", cluster="b200")
    fail(api, "new", "b200")
    (request,) = posted(receiver, 1)
    assert json.loads(request.body)["event"]["job_id"] == "new"
    assert api.delete(f"/api/webhooks/{hook['id']}").status_code == 200
    assert database.scalar("SELECT count(*) FROM webhook_deliveries") == 0


def test_the_retry_delay_doubles_from_one_second_to_ten_minutes():
    assert [deliveries.retry_delay(n) for n in (1, 2, 3, 4, 10, 11, 50)] == [1, 2, 4, 8, 512, 600, 600]


def test_a_redirect_is_a_failed_try_and_is_not_followed(api, recorder, database):
    elsewhere = recorder(script=answering())
    receiver = recorder(script=answering((302, {"Location": elsewhere.url + "/moved"}, b"")))
    subscribe(api, receiver.url)
    submit(api, "j1", cluster="b200")
    fail(api, "j1", "b200")
    posted(receiver, 1)
    row = wait_for(lambda: database.row("SELECT state, attempts, last_status FROM webhook_deliveries")
                   if database.scalar("SELECT attempts FROM webhook_deliveries") else None, 5, "the first try")
    assert row == ("pending", 1, 302)
    assert elsewhere.requests == []


@pytest.fixture
def store(database):
    """The store alone on an empty database, no dispatcher running."""
    database.clean()
    alone = Database(Settings(database_url=database.url))
    yield alone
    alone.dispose()


def job_events(store: Database, job_id: str, now: dt.datetime, steps: int = 0) -> list[int]:
    """Submit ``job_id`` on b200 and move it through ``steps`` starting events; its event ids, in feed order."""
    payload = JobCreatePayload(job_id=job_id, job_name=job_id, submitted_at=now, cluster="b200")
    store.run(functools.partial(job_store.submit, payload=payload), write=True)
    for n in range(steps):
        step = JobUpdatePayload(status=JobStatus.STARTING, message=f"step {n}", updated_at=now)
        assert store.run(functools.partial(job_store.update, job_id=job_id, payload=step, cluster="b200"), write=True)
    return store.run(lambda conn: list(conn.execute(
        select(deliveries.EVENTS.c.id).join(JOBS, JOBS.c.id == deliveries.EVENTS.c.job_pk)
        .where(JOBS.c.job_id == job_id).order_by(deliveries.EVENTS.c.id)).scalars()))


def nowhere(store: Database, now: dt.datetime, **fields) -> int:
    """A subscription to a port nothing listens on; its id."""
    create = WebhookCreate(url="http://127.0.0.1:9/x", **fields)
    return store.run(lambda conn: webhook_store.add(conn, create, now), write=True).id


def queue(store: Database, hooks: list[int], events: list[int], now: dt.datetime, *, attempts: int = 0,
          age: dt.timedelta = dt.timedelta(0)) -> None:
    """A pending delivery of each of ``events`` to each of ``hooks``, made ``age`` ago."""
    store.run(lambda conn: conn.execute(insert(deliveries.DELIVERIES), [
        {"webhook_id": hook, "event_id": event, "state": "pending", "attempts": attempts, "created_at": now - age,
         "next_attempt_at": now - age} for hook in hooks for event in events]), write=True)


def test_a_failure_backs_off_and_one_past_a_day_is_given_up(store, database):
    # Two deliveries made an hour and a day ago fail once more.
    now = dt.datetime.now(dt.UTC)
    # One subscription each: a subscription's second delivery would wait behind its first.
    events = [job_events(store, job_id, now)[0] for job_id in ("young", "old")]
    for event, age in zip(events, (dt.timedelta(hours=1), deliveries.GIVE_UP_AFTER + dt.timedelta(seconds=1)),
                          strict=True):
        queue(store, [nowhere(store, now)], [event], now, attempts=2, age=age)
    claimed = [c for run in store.run(lambda conn: deliveries.claim(conn, now, 10), write=True) for c in run]
    assert [(c.event.job_id, c.attempts) for c in claimed] == [("young", 2), ("old", 2)]
    answers = [deliveries.Answer(c, 503, "busy", now) for c in claimed]
    outcomes = store.run(functools.partial(deliveries.finish, answers=answers), write=True)
    assert outcomes == ["retried", "dead"]
    young, old = (database.row("SELECT state, attempts, last_status, last_error, next_attempt_at, claimed_until "
                               "FROM webhook_deliveries WHERE event_id = :e", e=event) for event in events)
    assert young[:4] == ("pending", 3, 503, "busy") and young[5] is None
    assert parse_stamp(young[4]) == now + dt.timedelta(seconds=deliveries.retry_delay(3))  # 4 s after the third
    assert old[:4] == ("dead", 3, 503, "busy")


def parse_stamp(value) -> dt.datetime:
    """A timestamp column read raw: aware on PostgreSQL, naive UTC text or datetime on SQLite."""
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value


def test_a_subscription_s_queue_goes_in_runs_and_a_failure_sends_the_rest_back_untried(store, database):
    # Five deliveries queued for one subscription, five for another.
    now = dt.datetime.now(dt.UTC)
    events = job_events(store, "q", now, steps=4)
    assert len(events) == 5
    queue(store, [nowhere(store, now), nowhere(store, now)], events, now)

    def claim(at: dt.datetime, limit: int = 10, run: int = deliveries.RUN) -> list[list[int]]:
        runs = store.run(lambda conn: deliveries.claim(conn, at, limit, run), write=True)
        return [[c.event_id for c in r] for r in runs]

    first = store.run(lambda conn: deliveries.claim(conn, now, 1, 3), write=True)
    # One subscription (limit 1), its three oldest in feed order (run 3); nothing else is due
    # while they are held: the rest of that queue waits behind them, the other is taken next.
    assert [[c.event_id for c in r] for r in first] == [events[:3]]
    assert claim(now) == [events]
    assert claim(now) == []
    second, third = first[0][1], first[0][2]
    outcomes = store.run(functools.partial(deliveries.finish, answers=[
        deliveries.Answer(first[0][0], 204, None, now), deliveries.Answer(second, 503, "busy", now),
        deliveries.Answer(third, None, None, now, tried=False)]), write=True)
    assert outcomes == ["sent", "retried", "untried"]
    assert [state_of(database, c.id) for c in first[0]] == [("sent", 1, 204), ("pending", 1, 503),
                                                             ("pending", 0, None)]
    # The failed one goes again after its delay, alone (its receiver is known to fail), and
    # the untried one is not held: it waits only for the failed one, in order.
    assert claim(now + dt.timedelta(seconds=0.5)) == []
    later = now + dt.timedelta(seconds=deliveries.retry_delay(1))
    retried = store.run(lambda conn: deliveries.claim(conn, later, 10), write=True)
    assert [[c.event_id for c in r] for r in retried] == [[second.event_id]]
    store.run(functools.partial(deliveries.finish, answers=[deliveries.Answer(retried[0][0], 200, None, later)]),
              write=True)
    assert claim(later) == [events[2:]]


def test_a_claim_that_began_before_a_delivery_was_sent_does_not_take_it(postgres, store):
    # PostgreSQL, where claims run in several processes at once. A claim reads the queues
    # from its snapshot and then locks the heads it picked; a head another sender leased,
    # sent and recorded in between is newer than that snapshot when locked. The claim must
    # look at the row it locked, not the one it read: before, such a head went out twice.
    # 100,000 subscriptions with one delivery each keep the claim reading long enough
    # (about 0.1 s) for the other sender to act meanwhile.
    now = dt.datetime.now(dt.UTC)
    job_events(store, "late", now)
    with postgres.engine.begin() as conn:
        conn.execute(text("INSERT INTO webhooks (url, statuses, clusters, format, enabled, start_after, created_at) "
                          "SELECT 'http://127.0.0.1:9/x', '[]', '[]', 'json', true, 0, now() "
                          "FROM generate_series(1, 100000)"))
        conn.execute(text("INSERT INTO webhook_deliveries (webhook_id, event_id, state, attempts, created_at, "
                          "next_attempt_at) SELECT w.id, e.id, 'pending', 0, :now, :now "
                          "FROM webhooks w CROSS JOIN job_events e ORDER BY w.id"), {"now": now})
        head = conn.execute(text("SELECT min(id) FROM webhook_deliveries")).scalar()
        conn.execute(text("ANALYZE webhooks; ANALYZE webhook_deliveries"))
    claimed: list[list[deliveries.Claimed]] = []
    late = threading.Thread(target=lambda: claimed.extend(
        store.run(lambda conn: deliveries.claim(conn, now, 1), write=True)))
    late.start()
    wait_for(lambda: postgres.scalar("SELECT count(*) FROM pg_stat_activity WHERE state = 'active' "
                                     "AND query LIKE '%EXECUTE collector_delivery_claim%'") or None, 10,
             "the claim to start")
    # Another sender's whole life of that head: leased, sent, recorded.
    with postgres.engine.begin() as sender:
        sender.execute(text("UPDATE webhook_deliveries SET claimed_until = :until WHERE id = :id"),
                       {"until": now + deliveries.LEASE, "id": head})
    with postgres.engine.begin() as sender:
        sender.execute(text("UPDATE webhook_deliveries SET state = 'sent', attempts = 1, last_status = 204, "
                            "sent_at = :now, claimed_until = NULL WHERE id = :id"), {"now": now, "id": head})
    assert late.is_alive(), "the claim ended before the other sender recorded its head: the test proves nothing"
    late.join(30)
    assert [[c.id for c in run] for run in claimed] == [[head + 1]]
    assert postgres.row("SELECT state, claimed_until FROM webhook_deliveries WHERE id = :i", i=head) == ("sent", None)


def test_a_delivery_whose_event_is_gone_is_dropped_by_the_claim_not_sent(store, database):
    # Events are deleted with their deliveries (the foreign key cascades). Were one deleted
    # without it (foreign keys off: a restore, a hand-run DELETE), its delivery has nothing
    # to send: the claim drops it and takes the next one.
    now = dt.datetime.now(dt.UTC)
    first, second = job_events(store, "gone", now, steps=1)
    queue(store, [nowhere(store, now)], [first, second], now)
    with database.engine.begin() as conn:
        if database.is_postgres:
            conn.execute(text("SET LOCAL session_replication_role = replica"))  # no foreign key triggers
        conn.execute(text("DELETE FROM job_events WHERE id = :i"), {"i": first})
    runs = store.run(lambda conn: deliveries.claim(conn, now, 10), write=True)
    assert [[(c.event_id, c.event.status) for c in run] for run in runs] == [[(second, "starting")]]
    assert database.scalar("SELECT count(*) FROM webhook_deliveries WHERE event_id = :e", e=first) == 0


def test_a_fan_out_that_stops_at_a_full_batch_says_more_wait(store, database):
    # A burst bigger than a batch. The loop fans out again at once while the batch was
    # full, rather than a poll interval later (webhook_delivery.Dispatcher).
    now = dt.datetime.now(dt.UTC)
    burst = deliveries.FAN_OUT_BATCH + 7
    hook = nowhere(store, now, statuses=[JobStatus.STARTING])
    job_events(store, "burst", now)
    job_pk = database.scalar("SELECT id FROM jobs WHERE job_id = 'burst'")
    for n in range(burst):  # one transaction each: on PostgreSQL an event's id comes from its transaction's
        with database.engine.begin() as conn:
            conn.execute(insert(deliveries.EVENTS), {"job_pk": job_pk, "status": "starting", "message": f"step {n}",
                                                     "created_at": now})
    fanned = [store.run(lambda conn: deliveries.fan_out(conn, now), write=True) for _ in range(3)]
    # The first batch holds the submitted event too (no subscriber: none made for it).
    assert fanned == [deliveries.FanOut(deliveries.FAN_OUT_BATCH - 1, more=True), deliveries.FanOut(8, more=False),
                      deliveries.FanOut()]
    assert database.scalar("SELECT count(*) FROM webhook_deliveries WHERE webhook_id = :h", h=hook) == burst


def test_a_fan_out_reads_the_feed_from_its_cursor_not_from_the_start(postgres, store):
    # PostgreSQL. The cursor's position must bound the scan of the feed. Written as a join
    # condition it bounded nothing: every fan-out read every event ever stored (80 ms a
    # turn at 100,000 events, in every worker, while writes came in). 20,000 events sit
    # before the cursor here (ids below any transaction's, so they are settled), 10 after it.
    now = dt.datetime.now(dt.UTC)
    (latest,) = job_events(store, "long", now)
    with postgres.engine.begin() as conn:
        conn.execute(text("INSERT INTO job_events (id, job_pk, status, created_at) "
                          "SELECT -g, id, 'starting', :now FROM jobs, generate_series(1, 20010) AS g"), {"now": now})
        conn.execute(text("UPDATE webhook_cursor SET position = -11 WHERE id = 1"))
        conn.execute(text("ANALYZE job_events"))
    with store.engine.connect() as conn, conn.begin():
        fanned = deliveries.fan_out(conn, now)
        # This transaction's own counts: the events its statements read.
        read = conn.execute(text("SELECT seq_tup_read + coalesce(idx_tup_fetch, 0) FROM pg_stat_xact_user_tables "
                                 "WHERE relname = 'job_events'")).scalar()
    assert fanned == deliveries.FanOut(0, more=False)
    # The 11 events after the cursor, and the planner's look at the index's ends to
    # estimate the range (a few rows, more when dead ones lie there): 13 to 17 seen, and
    # 20,013 before the fix.
    assert 11 <= read < 100
    assert postgres.scalar("SELECT position FROM webhook_cursor WHERE id = 1") == latest


def test_a_burst_bigger_than_a_batch_becomes_deliveries_without_waiting_for_polls(serve, database):
    # A collector that looks for new events every 2 s. The feed gets 1,100 events the
    # subscription matches, all at once (the cursor put back before them); the fan-out takes
    # them 500 at a time, and goes again at once while a batch comes back full.
    api = serve(write_token="w-" + uuid.uuid4().hex, webhook_poll_s=2.0)
    hook = subscribe(api, "http://127.0.0.1:9/x", statuses=["starting"])["id"]
    submit(api, "burst", cluster="b200")
    job_pk = database.scalar("SELECT id FROM jobs WHERE job_id = 'burst'")
    with database.engine.begin() as conn:
        conn.execute(text("UPDATE webhooks SET enabled = false WHERE id = :h"), {"h": hook})
    before = database.scalar("SELECT max(id) FROM job_events")
    burst = 2 * deliveries.FAN_OUT_BATCH + 100
    for n in range(burst):  # one transaction each: on PostgreSQL an event's id comes from its transaction's
        with database.engine.begin() as conn:
            conn.execute(insert(deliveries.EVENTS), {"job_pk": job_pk, "status": "starting", "message": f"step {n}",
                                                     "created_at": dt.datetime.now(dt.UTC)})
    newest = database.scalar("SELECT max(id) FROM job_events")
    wait_for(lambda: database.scalar("SELECT position FROM webhook_cursor") == newest or None, 20,
             "the fan-out to pass the burst while the subscription is off")
    with database.engine.begin() as conn:
        conn.execute(text("UPDATE webhook_cursor SET position = :p"), {"p": before})
        conn.execute(text("UPDATE webhooks SET enabled = true WHERE id = :h"), {"h": hook})

    def made() -> int:
        return database.scalar("SELECT count(*) FROM webhook_deliveries WHERE webhook_id = :h", h=hook)

    wait_for(lambda: made() or None, 10, "the first batch")
    started = time.monotonic()
    wait_for(lambda: made() == burst or None, 20, "every delivery of the burst")
    assert time.monotonic() - started < 1.5  # two more batches, not two more polls (4 s)
