"""PostgreSQL's feed without a feed lock: transaction ids as event ids, read below the horizon.

Writers commit in parallel (store/event_ids.py). These tests hold a transaction open by
hand at the moment that matters, so each fails if the guarantee it names is removed.
"""

from __future__ import annotations

import time

import psycopg
import pytest
from sqlalchemy import create_engine
from sqlalchemy import make_url
from sqlalchemy import text
from sqlalchemy.pool import NullPool

from collector import migrations
from tests import sse
from tests.helpers import detail
from tests.helpers import put
from tests.helpers import submit


def driver_url(database) -> str:
    return make_url(database.url).set(drivername="postgresql").render_as_string(hide_password=False)


def feed(api, after: int) -> list[tuple[int, str]]:
    response = api.get("/api/events", params={"after": after, "limit": 100})
    assert response.status_code == 200, response.text
    return [(e["id"], e["job_id"]) for e in response.json()["events"]]


def job_pk(database, job_id: str) -> int:
    return database.scalar("SELECT id FROM jobs WHERE job_id = :j", j=job_id)


LATER = "2026-12-03T09:00:00Z"  # after the helpers' submit stamp: not a late PUT


def written(api, job_id: str, status: str) -> None:
    assert put(api, job_id, status, updated_at=LATER).status_code == 200


def newest(api) -> int:
    response = api.get("/api/events", params={"after": 0, "limit": 1000})
    return max((e["id"] for e in response.json()["events"]), default=0)


def test_a_poller_never_passes_an_event_still_being_written(postgres, api):
    submit(api, "slow")
    submit(api, "fast")
    cursor = newest(api)
    with psycopg.connect(driver_url(postgres)) as held:
        # A writer that drew its id first and has not committed yet.
        row = held.execute(
            "INSERT INTO job_events (job_pk, status, created_at) VALUES (%s, 'workers', now()) RETURNING id",
            (job_pk(postgres, "slow"),)).fetchone()
        assert row is not None
        (slow_id,) = row
        written(api, "fast", "workers")  # a larger id, committed first
        fast_id = detail(api, "fast")["events"][-1]["id"]
        assert fast_id > slow_id
        # A poller that read "fast" now would move its cursor past "slow" for good.
        assert feed(api, cursor) == []
        # A job's own timeline is not held back: its writers are ordered by its lock.
        assert [e["status"] for e in detail(api, "fast")["events"]] == ["submitted", "workers"]
        held.commit()
    assert feed(api, cursor) == [(slow_id, "slow"), (fast_id, "fast")]


def test_a_stream_gets_an_event_held_back_by_a_transaction_that_writes_none(postgres, serve):
    server = serve(write_token="w", stream_heartbeat_s=0.3)
    submit(server, "j1")
    stream = sse.connect(server.url, "/api/events/stream", token="w", params={}, headers={})
    try:
        with psycopg.connect(driver_url(postgres)) as held:
            # Any write transaction holds the horizon; this one appends no event, so its
            # commit announces nothing: the hub must keep re-reading by itself.
            held.execute("SELECT pg_current_xact_id()")
            written(server, "j1", "workers")
            assert [f for f in stream.quiet_for(1.0) if f.event != "heartbeat"] == []
            held.commit()
            committed = time.monotonic()
        (frame,) = stream.events(1, timeout=5.0)
        assert (frame.json()["job_id"], frame.json()["status"]) == ("j1", "workers")
        assert time.monotonic() - committed < 2.0
    finally:
        stream.close()


def test_new_ids_stay_above_ids_restored_from_another_cluster(postgres, api):
    submit(api, "before")
    pk = job_pk(postgres, "before")
    # What a restore into a new cluster looks like: stored ids far above its transaction ids.
    restored = postgres.scalar("SELECT collector_feed_horizon() + 1000000000")
    with postgres.engine.begin() as conn:
        conn.execute(text("INSERT INTO job_events (id, job_pk, status, created_at) "
                          "VALUES (:id, :pk, 'workers', now())"), {"id": restored, "pk": pk})
    engine = create_engine(postgres.url, poolclass=NullPool)
    try:
        shift = migrations.settle_event_ids(engine)
        assert shift is not None
        assert migrations.settle_event_ids(engine) is None  # settled: nothing more to raise
    finally:
        engine.dispose()
    written(api, "before", "completed")
    events = detail(api, "before")["events"]
    assert [e["status"] for e in events] == ["submitted", "workers", "completed"]
    assert events[-1]["id"] > restored
    assert feed(api, restored) == [(events[-1]["id"], "before")]


@pytest.mark.parametrize("rows", [0, 3])
def test_the_upgrade_puts_new_ids_above_the_sequence_ones(postgres, new_database, rows):
    url = new_database()  # a PostgreSQL one: the postgres fixture skipped this test otherwise
    migrations.upgrade(url, "0007")
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO jobs (cluster, job_id, job_name, is_placeholder, status, submitted_at,"
                              " updated_at, received_at)"
                              " VALUES ('a', '7', 'n', false, 'workers', now(), now(), now())"))
            # Far above any transaction id of a test cluster: the new ids must still exceed it.
            conn.execute(text("SELECT setval('job_events_id_seq', 5000000000)"))
            for _ in range(rows):
                conn.execute(text("INSERT INTO job_events (job_pk, status, created_at) "
                                  "SELECT id, 'workers', now() FROM jobs"))
        migrations.upgrade(url)
        with engine.begin() as conn:
            new = conn.execute(text("INSERT INTO job_events (job_pk, status, created_at) "
                                    "SELECT id, 'completed', now() FROM jobs RETURNING id")).scalar_one()
        assert new > (5000000000 + rows if rows else 0)
        with engine.begin() as conn:
            # A second event in one transaction has no id of its own: the key refuses it.
            conn.execute(text("INSERT INTO job_events (job_pk, status, created_at) SELECT id, 'x', now() FROM jobs"))
            with pytest.raises(Exception, match="pk_job_events"):
                conn.execute(text("INSERT INTO job_events (job_pk, status, created_at) "
                                  "SELECT id, 'y', now() FROM jobs"))
    finally:
        engine.dispose()


def _id_functions(conn) -> dict[str, tuple[str, int, int]]:
    """Each id function's language, its value and the value its definition says, in one transaction."""
    languages = dict(conn.execute(text(
        "SELECT p.proname, l.lanname FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang "
        "WHERE p.proname IN ('collector_event_id', 'collector_feed_horizon')")).all())
    row = conn.execute(text(
        "SELECT collector_event_id() AS event_id, collector_feed_horizon() AS horizon, "
        "pg_current_xact_id()::text::bigint AS xid, "
        "pg_snapshot_xmin(pg_current_snapshot())::text::bigint AS xmin, "
        "(SELECT shift FROM event_id_shift) AS shift")).one()
    return {
        "collector_event_id": (languages["collector_event_id"], row.event_id, row.xid + row.shift),
        "collector_feed_horizon": (languages["collector_feed_horizon"], row.horizon, row.xmin + row.shift),
    }


def test_the_id_functions_keep_their_plans_and_their_values_across_revision_0014(postgres, new_database):
    url = new_database()
    migrations.upgrade(url)
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(text("UPDATE event_id_shift SET shift = 1000"))
        for revision, language in (("head", "plpgsql"), ("0013", "sql"), ("head", "plpgsql")):
            if revision == "head":
                migrations.upgrade(url)
            else:
                migrations.downgrade(url, revision)
            with engine.begin() as conn:
                for name, (found, value, defined) in _id_functions(conn).items():
                    # PL/pgSQL keeps its SELECT's plan per session; a SQL function reading a
                    # table is planned again by every statement that calls it.
                    assert (name, found) == (name, language)
                    assert value == defined
    finally:
        engine.dispose()
