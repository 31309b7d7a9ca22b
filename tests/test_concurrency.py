"""Concurrency: one row per job under racing first writes, and a feed that never skips."""

from __future__ import annotations

import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.processes import ServerProcess
from tests.processes import child_env


@pytest.fixture
def gunicorn(database):
    """The collector under gunicorn with several worker processes on the session database."""
    database.clean()
    server = ServerProcess(
        [sys.executable, "-m", "gunicorn", "-c", "deploy/gunicorn.conf.py", "collector.wsgi:app"],
        child_env(COLLECTOR_DATABASE_URL=database.url, COLLECTOR_PORT="0", COLLECTOR_WORKERS="3",
                  COLLECTOR_THREADS="4", SRTCTL_STATUS_TOKEN="w"),
    )
    yield server
    assert server.stop() == 0, server.output


def write(url: str, kind: str, job_id: str, i: int) -> int:
    headers = {"Authorization": "Bearer w"}
    if kind == "post":
        body: dict[str, object] = {"job_id": job_id, "job_name": "race", "cluster": "c1" if i % 2 else None,
                "submitted_at": f"2025-01-26T10:{i % 60:02d}:00Z"}
        body = {k: v for k, v in body.items() if v is not None}
        return requests.post(f"{url}/api/jobs", json=body, headers=headers, timeout=30).status_code
    metadata = {"cluster": "c1"} if i % 3 == 0 else {"job_name": "race"}
    body = {"status": "starting", "stage": "starting", "message": f"attempt {i % 4}",
            "updated_at": "2025-01-26T10:33:00Z", "metadata": metadata}
    return requests.put(f"{url}/api/jobs/{job_id}", json=body, headers=headers, timeout=30).status_code


def race_first_writes(url: str, database, rounds: int = 5, writers: int = 24) -> None:
    for r in range(rounds):
        job_id = f"race-{r}"
        kinds = ["post" if i % 2 else "put" for i in range(writers)]
        barrier = threading.Barrier(writers)

        def go(i: int, barrier: threading.Barrier = barrier, kinds: list[str] = kinds,
               job_id: str = job_id) -> tuple[str, int]:
            barrier.wait()
            return kinds[i], write(url, kinds[i], job_id, i)

        with ThreadPoolExecutor(writers) as pool:
            results = list(pool.map(go, range(writers)))
        assert all(code == (201 if kind == "post" else 200) for kind, code in results), results
        assert database.scalar("SELECT count(*) FROM jobs WHERE job_id = :j", j=job_id) == 1
        assert database.scalar("SELECT cluster FROM jobs WHERE job_id = :j", j=job_id) == "c1"
    database.assert_counts_match_jobs()


def test_racing_first_writes_make_one_row_in_threads(serve, database):
    server = serve(write_token="w")
    race_first_writes(server.url, database)


def test_racing_first_writes_make_one_row_across_gunicorn_workers(gunicorn, database):
    race_first_writes(gunicorn.url, database)
    assert "Traceback" not in gunicorn.output


def test_feed_pollers_see_every_event_exactly_once_under_concurrent_writers(postgres, gunicorn):
    writers, updates, pollers = 16, 40, 4
    done = threading.Event()
    seen: list[list[int]] = [[] for _ in range(pollers)]
    errors: list[str] = []

    def poll_once(p: int, after: int) -> int:
        response = requests.get(f"{gunicorn.url}/api/events", params={"after": after, "limit": 50},
                                headers={"Authorization": "Bearer w"}, timeout=30)
        if response.status_code != 200:
            errors.append(response.text)
            return after
        body = response.json()
        seen[p].extend(e["id"] for e in body["events"])
        return body["next_cursor"] if body["next_cursor"] is not None else after

    def poller(p: int) -> None:
        after = 0
        while not done.is_set():
            after = poll_once(p, after)
        # Writers have finished: drain what is left.
        while (new := poll_once(p, after)) != after:
            after = new

    def writer(w: int) -> None:
        for u in range(updates):
            body = {"status": "workers", "stage": "workers", "message": f"step {u}",
                    "updated_at": "2025-01-26T10:35:00Z", "metadata": {"cluster": f"c{w % 3}"}}
            response = requests.put(f"{gunicorn.url}/api/jobs/feed-{w}", json=body,
                                    headers={"Authorization": "Bearer w"}, timeout=30)
            if response.status_code != 200:
                errors.append(response.text)

    watchers = [threading.Thread(target=poller, args=(p,)) for p in range(pollers)]
    for watcher in watchers:
        watcher.start()
    with ThreadPoolExecutor(writers) as pool:
        list(pool.map(writer, range(writers)))
    done.set()
    for watcher in watchers:
        watcher.join(timeout=60)
    assert errors == []
    assert postgres.scalar("SELECT count(*) FROM job_events") == writers * updates
    postgres.assert_counts_match_jobs()
    for ids in seen:
        # Every poller got every event, once each, in id order: nothing skipped, nothing repeated.
        assert len(ids) == writers * updates
        assert ids == sorted(ids) and len(set(ids)) == len(ids)
