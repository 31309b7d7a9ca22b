"""The webhooks scenario: 100 subscriptions, a steady 100 events/s, and what reached which receiver when.

    python -m bench.run --only webhooks --backends postgres

Issue 18's three figures, each side by side with the same collector without subscriptions
(the order alternates per round, so drift cancels):

- **Writes.** The steady load (bench/streams.py's open-loop lifecycle PUTs, 100 a second on
  fresh connections, over clusters ``w0``..``w9``) runs through the whole phase; on top of
  it wrk measures how many PUTs a second the collector still takes (bench.lua's put mode,
  16 fresh connections, clusters ``c0``..``c3`` that no subscription names, so the
  deliveries stay those of the steady load while every wrk event still passes the fan-out).
- **Delivery latency** to healthy receivers: a receiver's receipt time minus the time the
  PUT that made the event was answered (same machine, same clock).
- **A receiver that hangs**: one subscription's receiver reads each request and never
  answers. The other nine subscriptions of its cluster get the same events; their latency
  is reported on its own.

The subscriptions, chosen to look like a shared deployment: on each of the 10 clusters one
subscription takes every event (an audit channel) and nine take the finished ones (the
default statuses: team channels), so every event is delivered at least once and the
finished ones ten times: about 212 deliveries a second. Subscription 10 (finished, ``w0``)
is the one that hangs.

Receivers run in one separate process (``python -m bench.webhooks receive``, asyncio with
raw sockets), so their CPU is not this one's. The database is the truth for what each
receiver should have got: every event of the phase whose status and cluster its
subscription names. Every loop and wait is bounded in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import requests
from sqlalchemy import create_engine
from sqlalchemy import text
from sqlalchemy.pool import NullPool

from bench import streams
from bench.blobs import worker_pids
from collector.contract import JobStatus
from collector.webhook_contract import FINISHED

ROOT = Path(__file__).resolve().parents[1]
SUBSCRIPTIONS = 100
CLUSTERS = 10
CLUSTER_PREFIX = "w"  # the steady load's clusters; bench.lua's wrk load writes to c0..c3
HANGING = 10  # the subscription whose receiver never answers
ALL_STATUSES = tuple(s.value for s in JobStatus)
FINISHED_STATUSES = tuple(s.value for s in FINISHED)


class WebhooksFailure(Exception):
    """The receiver process failed to start or report, or the collector refused the set-up."""


def subscription(i: int) -> tuple[str, tuple[str, ...]]:
    """Subscription ``i``'s cluster and statuses: the first of each cluster takes every event."""
    return f"{CLUSTER_PREFIX}{i % CLUSTERS}", ALL_STATUSES if i < CLUSTERS else FINISHED_STATUSES


# -- the receiver process ------------------------------------------------------------


async def _receive(limit_s: float) -> None:
    """Answer ``POST /ok/N`` with 204 and never answer ``POST /hang/N``; report receipts on "dump"."""
    receipts: list[tuple[int, int, float]] = []  # (subscription, event id, time.time())
    hung: list[int] = [0]  # requests the hanging receiver read

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Kept alive, as a real receiver would: one connection serves a sender's requests in turn.
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                lines = head.split(b"\r\n")
                path = lines[0].split(b" ")[1].decode()
                length = next((int(line[15:]) for line in lines if line[:15].lower() == b"content-length:"), 0)
                body = await reader.readexactly(length)
                now = time.time()
                kind, number = path.strip("/").split("/")
                if kind == "hang":
                    hung[0] += 1
                    await reader.read()  # until the collector gives up and closes
                    return
                receipts.append((int(number), json.loads(body)["event"]["id"], now))
                writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError, KeyError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
    port = server.sockets[0].getsockname()[1]
    loop = asyncio.get_running_loop()
    commands: asyncio.Queue[str] = asyncio.Queue()
    threading.Thread(target=lambda: [loop.call_soon_threadsafe(commands.put_nowait, line) for line in sys.stdin]
                     + [loop.call_soon_threadsafe(commands.put_nowait, "")], daemon=True).start()
    print(f"ready {port}", flush=True)
    deadline = loop.time() + limit_s
    while loop.time() < deadline:
        try:
            command = await asyncio.wait_for(commands.get(), deadline - loop.time())
        except TimeoutError:
            break
        if command.strip() != "dump":
            break
        taken, receipts[:] = list(receipts), []
        print("receipts " + json.dumps({"receipts": taken, "hung": hung[0]}), flush=True)
    server.close()
    sys.stdout.flush()
    os._exit(0)  # without waiting for the connections the hanging receiver holds


class Receivers:
    """The receiver process, seen from here."""

    def __init__(self, *, time_limit: float, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.webhooks", "receive", str(time_limit)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env)
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.port = int(self._expect("ready", 30)[0])
        self.hung = 0

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put("")

    def _expect(self, word: str, timeout: float) -> list[str]:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise WebhooksFailure(f"the receiver process said nothing for {timeout:g} s") from None
        parts = line.split(" ", 1)
        if parts[0] != word:
            raise WebhooksFailure(f"the receiver process said {line.strip()[:200]!r}, not {word!r}"
                                  f" (exit code {self.proc.poll()})")
        return parts[1:]

    def url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.port}/{'hang' if i == HANGING else 'ok'}/{i}"

    def dump(self) -> list[tuple[int, int, float]]:
        """What reached the healthy receivers since the last dump: (subscription, event id, time)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("dump\n")
        self.proc.stdin.flush()
        report = json.loads(self._expect("receipts", 30)[0])
        self.hung = report["hung"]
        return [(sub, event_id, at) for sub, event_id, at in report["receipts"]]

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


# -- one phase -----------------------------------------------------------------------


@dataclasses.dataclass
class Phase:
    """What one phase's steady load made and what reached the receivers."""

    expected: int  # (healthy subscription, event) pairs the phase's events call for
    missing: int
    duplicates: int
    latencies_s: list[float]  # receipt - PUT response, per healthy (subscription, event)
    beside_hanging_s: list[float]  # the same, for the hanging one's cluster-mates (finished events of w0)
    unmatched: int  # expected pairs whose event no PUT of the load explains
    deliveries_per_s: float  # healthy receipts over the phase's steady-load seconds
    catch_up_s: float  # after the last PUT's answer, until every expected pair had arrived (or the wait ended)


def events_since(db_url: str, after: int) -> dict[int, tuple[streams.Key, str | None]]:
    """Every committed event with id > ``after``: its (job, status, stage, message) and cluster."""
    engine = create_engine(db_url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text(
                "SELECT e.id, j.job_id, e.status, e.stage, e.message, j.cluster FROM job_events e"
                " JOIN jobs j ON j.id = e.job_pk WHERE e.id > :after ORDER BY e.id"), {"after": after}).all()
    finally:
        engine.dispose()
    return {row[0]: (tuple(row[1:5]), row[5]) for row in rows}


def expected_pairs(events: dict[int, tuple[streams.Key, str | None]]) -> set[tuple[int, int]]:
    """The (subscription, event) pairs the healthy receivers must get."""
    wanted = {i: subscription(i) for i in range(SUBSCRIPTIONS) if i != HANGING}
    return {(i, event_id) for event_id, (key, cluster) in events.items()
            for i, (sub_cluster, statuses) in wanted.items() if cluster == sub_cluster and key[1] in statuses}


def steady_request(run: str) -> Callable[[int], tuple]:
    """The steady load's ``i``-th PUT: the lifecycle of 100 jobs over the ten subscribed clusters,
    staggered so that jobs finish at a steady 12.5 a second rather than all in the same second."""
    return lambda i: streams.lifecycle_put(run, 100, i, clusters=CLUSTERS, prefix=CLUSTER_PREFIX, stagger=True)


# -- the run -------------------------------------------------------------------------


@dataclasses.dataclass
class WebhooksRun:
    rate: float
    duration: float
    rounds: int
    paced: dict[str, list[streams.Paced]] = dataclasses.field(default_factory=lambda: {"with": [], "without": []})
    max_load: dict[str, list] = dataclasses.field(default_factory=lambda: {"with": [], "without": []})
    phases: list[Phase] = dataclasses.field(default_factory=list)  # with subscriptions: steady, then under wrk
    max_phases: list[Phase] = dataclasses.field(default_factory=list)
    cpu: dict[tuple[str, str], list[float]] = dataclasses.field(default_factory=dict)  # (who, side) -> % of a core
    hung: list[int] = dataclasses.field(default_factory=list)
    problems: list[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0


def _percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[max(math.ceil(pct / 100 * len(ordered)) - 1, 0)] if ordered else math.nan


def measure(url: str, token: str, master: int, db_url: str, *, rate: float, duration: float, rounds: int,
            max_throughput: Callable[[float], object], env: dict[str, str], run_id: Callable[[], str]) -> WebhooksRun:
    """Rounds of two phases each, with and without the subscriptions: ``duration`` s of the steady
    load alone (delivery latency), then ``duration`` s of it with wrk on top (write capacity)."""
    started = time.monotonic()
    result = WebhooksRun(rate, duration, rounds)
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {token}"
    wait_s = max(30.0, duration * 4)

    def subscribe(receivers: Receivers) -> list[int]:
        ids = []
        for i in range(SUBSCRIPTIONS):
            cluster, statuses = subscription(i)
            answer = session.post(f"{url}/api/webhooks", json={
                "url": receivers.url(i), "clusters": [cluster], "statuses": list(statuses)}, timeout=10)
            if answer.status_code != 201:
                raise WebhooksFailure(f"POST /api/webhooks answered {answer.status_code}: {answer.text[:300]}")
            ids.append(answer.json()["id"])
        return ids

    def unsubscribe(ids: list[int]) -> None:
        for webhook_id in ids:
            answer = session.delete(f"{url}/api/webhooks/{webhook_id}", timeout=10)
            if answer.status_code != 200:
                raise WebhooksFailure(f"DELETE /api/webhooks/{webhook_id} answered {answer.status_code}")

    def steady(seconds: float) -> streams.Paced:
        return asyncio.run(streams.paced(url, token, rate, seconds, steady_request(run_id())))

    def cpu_of(side: str, fn: Callable[[], streams.Paced]) -> streams.Paced:
        pids = worker_pids(master)
        t0, workers, pg = time.monotonic(), streams.cpu_seconds(pids), streams.postgres_cpu_seconds()
        out = fn()
        elapsed = time.monotonic() - t0
        for who, value in (("workers", streams.cpu_seconds(pids) - workers),
                           ("postgres", streams.postgres_cpu_seconds() - pg)):
            result.cpu.setdefault((who, side), []).append(100 * value / elapsed)
        return out

    def with_max(side: str) -> streams.Paced:
        # the steady load runs through the wrk run, a second longer at each end
        box: list[streams.Paced] = []
        load = threading.Thread(target=lambda: box.append(steady(duration + 2)))
        load.start()
        time.sleep(1)
        result.max_load[side].append(max_throughput(duration))
        load.join(duration + 60)
        if not box:
            raise WebhooksFailure("the steady load did not finish")
        return box[0]

    def collect(receivers: Receivers, before: int, load: streams.Paced) -> Phase:
        events = events_since(db_url, before)
        expected = expected_pairs(events)
        receipts: dict[tuple[int, int], list[float]] = {}
        last_answer = max((p.answered_at for p in load.puts), default=time.time())
        deadline = time.monotonic() + wait_s
        while True:
            for sub, event_id, at in receivers.dump():
                receipts.setdefault((sub, event_id), []).append(at)
            if expected <= receipts.keys() or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        arrived = [min(times) for pair, times in receipts.items() if pair in expected]
        answered = {p.key: p.answered_at for p in load.ok}
        latencies, beside, unmatched = [], [], 0
        for sub, event_id in expected & receipts.keys():
            key = events[event_id][0]
            if key not in answered:
                unmatched += 1
                continue
            latency = min(receipts[sub, event_id]) - answered[key]
            latencies.append(latency)
            if subscription(sub) == subscription(HANGING):
                beside.append(latency)
        seconds = max(load.finished - load.started, 1e-9)
        return Phase(expected=len(expected), missing=len(expected - receipts.keys()),
                     duplicates=sum(len(times) - 1 for times in receipts.values()), latencies_s=latencies,
                     beside_hanging_s=beside, unmatched=unmatched,
                     deliveries_per_s=len(expected) / seconds,
                     catch_up_s=max(max(arrived, default=last_answer) - last_answer, 0.0))

    def phase(side: str, receivers: Receivers) -> None:
        ids = subscribe(receivers) if side == "with" else []
        try:
            receivers.dump()
            before = streams.newest_event(db_url)
            load = cpu_of(side, lambda: steady(duration))
            result.paced[side].append(load)
            if side == "with":
                result.phases.append(collect(receivers, before, load))
            before = streams.newest_event(db_url)
            load = with_max(side)
            if side == "with":
                result.max_phases.append(collect(receivers, before, load))
                result.hung.append(receivers.hung)
            for p in (result.paced[side][-1], load):
                if p.non2xx or p.socket_errors:
                    result.problems.append(f"steady PUTs {side} subscriptions: {p.non2xx} non-2xx, "
                                           f"{p.socket_errors} socket errors of {len(p.puts)}")
        finally:
            unsubscribe(ids)

    receivers = Receivers(time_limit=600 + rounds * duration * 20, env=env)
    try:
        max_throughput(2)  # warm the workers and the database
        steady(2)
        for r in range(rounds):
            for side in ("without", "with") if r % 2 == 0 else ("with", "without"):
                phase(side, receivers)
    finally:
        receivers.stop()
        session.close()
    for name, phases in (("steady", result.phases), ("under wrk", result.max_phases)):
        for p in phases:
            if p.missing or p.duplicates or p.unmatched:
                result.problems.append(f"{name} phase: {p.missing} of {p.expected} deliveries missing, "
                                       f"{p.duplicates} duplicates, {p.unmatched} events no PUT explains")
    for side, loads in result.max_load.items():
        for load in loads:
            if load.non2xx or load.socket_errors:
                result.problems.append(f"wrk PUTs {side} subscriptions: {load.non2xx} non-2xx, "
                                       f"{load.socket_errors} socket errors")
    result.seconds = time.monotonic() - started
    return result


def report(result: WebhooksRun) -> list[tuple[str, float | None, float | None, str]]:
    """The table's rows: (measure, value, what it is compared with, target)."""
    med = statistics.median
    rows: list[tuple[str, float | None, float | None, str]] = []
    w, wo = result.paced["with"], result.paced["without"]
    rows.append((f"steady PUTs: achieved req/s of {result.rate:g}, with subscriptions (vs without)",
                 med(p.achieved_rate for p in w), med(p.achieved_rate for p in wo), "-"))
    for pct in (50, 99):
        rows.append((f"steady PUTs: PUT p{pct} ms with subscriptions (vs without)",
                     med(p.p_ms(pct) for p in w), med(p.p_ms(pct) for p in wo), "-"))
    loads = result.max_load
    rows.append(("max PUT req/s on top of the steady load (wrk put, 16 fresh connections) with subscriptions "
                 "(vs without)", med(r.requests_per_s for r in loads["with"]),
                 med(r.requests_per_s for r in loads["without"]), ">= 0.9"))
    rows.append(("max PUT p99 ms with subscriptions (vs without)", med(r.p99_ms for r in loads["with"]),
                 med(r.p99_ms for r in loads["without"]), "-"))
    lat = [x for p in result.phases for x in p.latencies_s]
    pairs = sum(p.expected for p in result.phases)
    rows.append(("deliveries a second to the healthy receivers, steady load",
                 med(p.deliveries_per_s for p in result.phases) if result.phases else None, None, "-"))
    for pct in (50, 99):
        rows.append((f"delivery ms p{pct}: receipt - PUT response, {len(lat):,} healthy deliveries, steady load",
                     _percentile(lat, pct) * 1000, None, "<= 2000" if pct == 99 else "-"))
    beside = [x for p in result.phases for x in p.beside_hanging_s]
    rows.append((f"delivery ms p99 to the 9 healthy subscriptions beside the hanging one ({len(beside):,})",
                 _percentile(beside, 99) * 1000, None, "<= 2000"))
    rows.append((f"deliveries missing or repeated, steady load, of {pairs:,}",
                 sum(p.missing + p.duplicates for p in result.phases), None, "0"))
    lat = [x for p in result.max_phases for x in p.latencies_s]
    pairs = sum(p.expected for p in result.max_phases)
    rows.append((f"delivery ms p99 while wrk saturates the machine, {len(lat):,} deliveries",
                 _percentile(lat, 99) * 1000, None, "-"))
    rows.append(("after the wrk run: s until the last delivery arrived",
                 med(p.catch_up_s for p in result.max_phases) if result.max_phases else None, None, "-"))
    rows.append((f"deliveries missing or repeated under wrk, of {pairs:,}",
                 sum(p.missing + p.duplicates for p in result.max_phases), None, "0"))
    for who, label in (("workers", "gunicorn workers"), ("postgres", "PostgreSQL")):
        values = {side: result.cpu.get((who, side)) for side in ("with", "without")}
        rows.append((f"CPU % of a core, {label}, steady load with subscriptions (vs without)",
                     med(values["with"]) if values["with"] else None,
                     med(values["without"]) if values["without"] else None, "-"))
    return rows


def notes(result: WebhooksRun) -> list[str]:
    """Per-round detail printed under the table."""
    out = []
    for i, (p, m) in enumerate(zip(result.phases, result.max_phases, strict=False)):
        out.append(f"- webhooks round {i + 1}: steady {p.expected} deliveries, p99 "
                   f"{_percentile(p.latencies_s, 99) * 1000:.0f} ms; under wrk {m.expected}, p99 "
                   f"{_percentile(m.latencies_s, 99) * 1000:.0f} ms, caught up {m.catch_up_s:.1f} s after")
    for side, loads in result.max_load.items():
        out.append(f"- max PUT req/s {side} subscriptions, per round: "
                   + ", ".join(f"{r.requests_per_s:.0f}" for r in loads))
    per_round = [now - before for before, now in zip([0, *result.hung], result.hung, strict=False)]
    out.append(f"- the hanging receiver read {', '.join(map(str, per_round))} requests per round (each held 10 s)")
    out.append(f"- webhooks scenario: {result.seconds:.0f} s, {result.rounds} round(s) of {result.duration:g} s "
               f"phases, {SUBSCRIPTIONS} subscriptions, steady {result.rate:g} PUTs/s over {CLUSTERS} clusters")
    return out


if __name__ == "__main__":
    if sys.argv[1:2] != ["receive"] or len(sys.argv) != 3:
        raise SystemExit("usage: python -m bench.webhooks receive TIME_LIMIT_S")
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    asyncio.run(_receive(float(sys.argv[2])))
