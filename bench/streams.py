"""The streams scenario's client side: hundreds of open event streams, a paced PUT load,
and what reached every stream when.

    python -m bench.run --only streams --backends postgres

Subscribers run in one separate process (``python -m bench.streams subscribe ...``, asyncio
with raw sockets), so their CPU is one process and none of it is this one's. Each records
the receipt time (``time.time()``) of every ``id:`` it reads; only subscriber 0 (the
reference) parses the frames' JSON, to map event ids to the (job, status, stage, message)
a PUT set. The load is an open-loop generator in this process: PUTs scheduled at a fixed
rate whatever the answers do, each on a fresh connection like the srtctl reporter, each
with the ``time.time()`` its response arrived. Same machine, same clock: delivery latency
is a stream's receipt time minus the PUT's response time.

The database is the truth for what a subscriber should have received: every event
committed during a phase (the streams start at the live edge before the load starts).
Every loop and wait is bounded in time.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import dataclasses
import itertools
import json
import marshal
import math
import os
import queue
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from sqlalchemy import create_engine
from sqlalchemy import text
from sqlalchemy.pool import NullPool

from bench import seed
from bench.blobs import idle_rss
from bench.blobs import worker_pids

ROOT = Path(__file__).resolve().parents[1]
PREAMBLE = b"retry: 1000\n: collector event stream\n\n"
# A job-event frame's id line; JSON escapes newlines, so no data line can look like one.
ID_LINE = re.compile(rb"\nid: (\d+)\n")
FRAME = re.compile(rb"\nid: (\d+)\nevent: job-event\ndata: ([^\n]*)\n")
PUT_TIMEOUT = 10.0
CLK_TCK = os.sysconf("SC_CLK_TCK")

# The srtctl lifecycle of bench/lua/bench.lua's put mode, without the submit: every step
# changes the (status, stage, message) triple, so every PUT appends exactly one event.
STEPS = seed.LIFECYCLE[1:]
CLUSTERS = 4
STARTED_METADATA = (
    '{"model": {"path": "/lustre/fsw/models/deepseek-ai/DeepSeek-R1-0528-FP4-v2-with-a-long-path", "container":'
    ' "nvcr.io/nvidia/ai-dynamo/sglang-runtime:0.6.1-cuda13-arm64-nightly", "precision": "fp4"}, "resources":'
    ' {"gpu_type": "gb200", "gpus_per_node": 4, "prefill_nodes": 2, "decode_nodes": 8, "prefill_workers": 2,'
    ' "decode_workers": 4, "agg_workers": null, "cpu_allocation": "0-71,72-143", "cpu_check": "ok: 144 cpus bound'
    ' to 4 gpus, numa nodes 0-1, no oversubscription"}, "benchmark": {"type": "sa-bench", "isl": 8192, "osl": 1024,'
    ' "concurrencies": "1x2x4x8x16x32x64x128x256x512x1024"}, "backend_type": "sglang", "frontend_type": "dynamo",'
    ' "head_node": "gb200-rack07-node-0413", "log_dir": "/lustre/fsw/coreai_devtech_all/outputs/JOBID/logs/'
    'JOBID_2P_4D_sa-bench_isl8192_osl1024_fp4_gb200_disagg", "job_name": "dsr1-fp4-gb200-2p4d-sa-bench-isl8192-'
    'osl1024-disagg-kv-router-sweep", "cluster": "CLUSTER", "tags": ["pipeline:98765", "suite:kv-router-comparison",'
    ' "owner:perf-team", "priority:nightly"], "srtctl_version": "0.9.4+g1a2b3c4", "recipe_digest": "sha256:5f2d8c0e9b7'
    'a6f4e3d2c1b0a99887766554433221100ffeeddccbbaa99887766"}'
)

Key = tuple  # (job_id, status, stage, message): what one PUT set, and the event it appended


class StreamsFailure(Exception):
    """The subscriber process failed to start, answer or report."""


def _percentile(ordered: list[float], pct: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    return ordered[max(math.ceil(pct / 100 * len(ordered)) - 1, 0)]


# -- the lifecycle PUTs ------------------------------------------------------------


def lifecycle_put(run: str, jobs: int, i: int, *, clusters: int = CLUSTERS, prefix: str = "c",
                  stagger: bool = False) -> tuple[Key, str, bytes]:
    """The ``i``-th PUT of a run: job-major over ``jobs`` jobs, so a job's next report comes
    ``jobs`` requests later; a job that completed is never reused (the next cycle's ids differ).
    Job ``n`` reports from cluster ``prefix`` + ``n % clusters``; with ``stagger`` its
    lifecycle starts ``n`` steps along (its first job joins mid-way), so jobs finish evenly."""
    n = i % jobs
    slot = i // jobs + (n if stagger else 0)
    step = slot % len(STEPS)
    job_id = f"{run}-{slot // len(STEPS)}-{n}"
    cluster = f"{prefix}{n % clusters}"
    status, stage, message = STEPS[step]
    if step == 0:
        metadata = STARTED_METADATA.replace("JOBID", job_id).replace("CLUSTER", cluster)
        body = (f'{{"status": "starting", "stage": "starting", "message": "{message}", "started_at":'
                f' "2025-01-26T10:33:00Z", "updated_at": "2025-01-26T10:33:00Z", "metadata": {metadata}}}')
    elif step == len(STEPS) - 1:
        body = (f'{{"status": "completed", "stage": "cleanup", "message": "{message}", "exit_code": 0, "logs_url":'
                f' "s3://bucket/outputs/{job_id}/", "completed_at": "2025-01-26T11:02:00Z", "updated_at":'
                f' "2025-01-26T11:02:00Z", "metadata": {{"cluster": "{cluster}"}}}}')
    else:
        body = (f'{{"status": "{status}", "stage": "{stage}", "message": "{message}", "updated_at":'
                f' "2025-01-26T10:40:00Z", "metadata": {{"cluster": "{cluster}"}}}}')
    return (job_id, status, stage, message), f"/api/jobs/{job_id}", body.encode()


@dataclasses.dataclass
class Put:
    key: Key
    status: int  # HTTP status; 0 for a socket error or timeout
    latency_s: float  # response complete - scheduled send (open loop: includes any queueing)
    answered_at: float  # time.time() when the response was complete


@dataclasses.dataclass
class Paced:
    puts: list[Put]
    started: float  # perf_counter of the first scheduled send
    finished: float  # perf_counter of the last answer

    @property
    def ok(self) -> list[Put]:
        return [p for p in self.puts if 200 <= p.status < 300]

    @property
    def non2xx(self) -> int:
        return sum(1 for p in self.puts if p.status and not 200 <= p.status < 300)

    @property
    def socket_errors(self) -> int:
        return sum(1 for p in self.puts if not p.status)

    @property
    def achieved_rate(self) -> float:
        return len(self.ok) / max(self.finished - self.started, 1e-9)

    def p_ms(self, pct: float) -> float:
        ordered = sorted(p.latency_s for p in self.ok)
        return _percentile(ordered, pct) * 1000 if ordered else math.nan


async def _put(host: str, port: int, head: bytes, body: bytes) -> tuple[int, float, float]:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(head + body)
        response = await reader.readuntil(b"\r\n\r\n")
        status = int(response.split(b" ", 2)[1])
        length = 0
        for line in response.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        await reader.readexactly(length)
        return status, time.perf_counter(), time.time()
    finally:
        writer.close()


async def paced(url: str, token: str, rate: float, duration: float, request: Callable[[int], tuple]) -> Paced:
    """Open loop: PUT ``request(i)`` (key, path, body) at ``rate`` per second for ``duration`` s,
    a fresh connection each (like the srtctl reporter), on schedule whatever the answers do."""
    parts = urlsplit(url)
    host, port = parts.hostname, parts.port
    assert host is not None and port is not None, url
    count = max(int(rate * duration), 1)
    puts: list[Put | None] = [None] * count

    async def one(i: int, at: float) -> None:
        key, path, body = request(i)
        head = (f"PUT {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {token}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
        try:
            status, done, wall = await asyncio.wait_for(_put(host, port, head, body), PUT_TIMEOUT)
        except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError, IndexError):
            status, done, wall = 0, time.perf_counter(), time.time()
        puts[i] = Put(key, status, done - at, wall)

    started = time.perf_counter() + 0.02
    tasks = []
    for i in range(count):
        at = started + i / rate
        delay = at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i, at)))  # never waits for an answer
    await asyncio.gather(*tasks)
    finished = max(started + p.latency_s + (i / rate) for i, p in enumerate(puts) if p is not None)
    return Paced([p for p in puts if p is not None], started, finished)


def paced_puts(url: str, token: str, *, rate: float, duration: float, run: str) -> Paced:
    """PUT the lifecycle at ``rate`` per second for ``duration`` s, a fresh connection each."""
    jobs = max(int(rate), 1)  # each job reports about once a second
    return asyncio.run(paced(url, token, rate, duration, lambda i: lifecycle_put(run, jobs, i)))


# -- the subscriber process -----------------------------------------------------


class _Subscriber(asyncio.Protocol):
    """One stream: its status, and the id and receipt time of every job-event it reads."""

    def __init__(self, request: bytes, reference: bool, changed: asyncio.Event) -> None:
        self.request, self.reference, self.changed = request, reference, changed
        self.ids = array.array("q")
        self.times = array.array("d")
        self.keys: list[tuple] = []  # the reference's (id, job_id, status, stage, message)
        self.status = 0
        self.error = ""
        self.ready = False
        self.stopping = False
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    @property
    def settled(self) -> bool:
        return self.ready or bool(self.error)

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.write(self.request)

    def connection_lost(self, exc) -> None:
        if not self.stopping and not self.error:
            self.error = f"stream closed by the server after {len(self.ids)} events ({exc or 'EOF'})"
            self.changed.set()

    def data_received(self, data: bytes) -> None:
        now = time.time()
        if self.ready:
            self._frames(data, now)
            return
        self.buffer += data
        if not self.status:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            try:
                self.status = int(self.buffer.split(b" ", 2)[1])
            except (IndexError, ValueError):
                self.status = -1
            if self.status != 200:
                self.error = f"HTTP {self.status}: {self.buffer[end + 4:][:200].decode(errors='replace')}"
                assert self.transport is not None  # data arrives only once connected
                self.transport.close()
                self.changed.set()
                return
            self.buffer = self.buffer[end + 2:]  # keeps a "\r\n" ahead of the first chunk
        start = self.buffer.find(PREAMBLE)
        if start >= 0:
            self.ready = True
            self.changed.set()
            rest, self.buffer = self.buffer[start + len(PREAMBLE) - 1:], b""
            self._frames(rest, now)

    def _frames(self, data: bytes, now: float) -> None:
        if self.buffer:
            data = self.buffer + data
        end = data.rfind(b"\n\n")
        if end < 0:
            self.buffer = data
            return
        if self.reference:
            for match in FRAME.finditer(data, 0, end + 2):
                event_id, doc = int(match[1]), json.loads(match[2])
                self.ids.append(event_id)
                self.times.append(now)
                self.keys.append((event_id, doc["job_id"], doc["status"], doc["stage"], doc["message"]))
        else:
            found = ID_LINE.findall(data, 0, end + 2)
            if found:
                self.ids.extend(map(int, found))
                self.times.extend(itertools.repeat(now, len(found)))
        # Keep the frame's last "\n": the next id line is matched with the newline before it.
        self.buffer = data[end + 1:]


async def _subscribe(host: str, port: int, token: str, count: int, time_limit: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + time_limit
    changed = asyncio.Event()
    request = (f"GET /api/events/stream HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {token}\r\n"
               "Accept: text/event-stream\r\n\r\n").encode()
    subs = [_Subscriber(request, i == 0, changed) for i in range(count)]

    async def connect(sub: _Subscriber) -> None:
        try:
            await loop.create_connection(lambda: sub, host, port)
        except OSError as exc:
            sub.error = f"connect: {exc}"

    settle_by = time.monotonic() + 30
    await asyncio.gather(*(connect(s) for s in subs))
    while not all(s.settled for s in subs) and time.monotonic() < settle_by:
        changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), 1.0)
    ok = sum(1 for s in subs if s.ready and not s.error)
    errors = [s.error or "no preamble within 30 s" for s in subs if not s.ready or s.error]
    _say("READY", ok, count - ok, json.dumps(errors[0] if errors else ""))

    commands: asyncio.Queue[str] = asyncio.Queue()

    def read_stdin() -> None:
        for line in sys.stdin:
            loop.call_soon_threadsafe(commands.put_nowait, line)
        loop.call_soon_threadsafe(commands.put_nowait, "EOF")

    threading.Thread(target=read_stdin, daemon=True).start()
    while loop.time() < deadline:
        try:
            line = await asyncio.wait_for(commands.get(), deadline - loop.time())
        except TimeoutError:
            break
        words = line.split()
        if words[:1] == ["WAIT"]:
            # Until every stream that is still open has the event ``target``, or ``timeout`` s.
            target, timeout = int(words[1]), float(words[2])
            t0 = time.monotonic()
            while True:
                behind = sum(1 for s in subs if s.ready and not s.error and (not s.ids or s.ids[-1] < target))
                if not behind or time.monotonic() - t0 > timeout:
                    break
                await asyncio.sleep(0.005)
            _say("CAUGHT", behind, f"{time.monotonic() - t0:.3f}", sum(1 for s in subs if s.error))
        elif words[:1] == ["STOP"]:
            for s in subs:
                s.stopping = True
                if s.transport is not None:
                    s.transport.close()
            with open(words[1], "wb") as f:
                marshal.dump([(s.ids.tobytes(), s.times.tobytes(), s.status, s.error, s.ready) for s in subs]
                             + [subs[0].keys if subs else []], f)
            _say("DONE")
            return
        else:  # EOF: the bench went away
            break


def _say(*words) -> None:
    print(*words, flush=True)


@dataclasses.dataclass
class Stream:
    ids: array.array
    times: array.array
    status: int
    error: str
    ready: bool


@dataclasses.dataclass
class Received:
    streams: list[Stream]
    reference: dict[int, Key]  # event id -> what the reference stream says the event was


class Subscribers:
    """The subscriber process: ``count`` streams of ``GET /api/events/stream`` from the live edge."""

    def __init__(self, url: str, token: str, count: int, *, time_limit: float, env: dict[str, str]) -> None:
        parts = urlsplit(url)
        assert parts.hostname is not None, url
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - read and closed once the subscriber ends
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.streams", "subscribe", parts.hostname, str(parts.port), token, str(count),
             str(time_limit)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True, cwd=ROOT, env=env)
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None  # a pipe
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _expect(self, word: str, timeout: float, fields: int = -1) -> list[str]:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            line = None
        if line is None or not line.startswith(word + " ") and line.strip() != word:
            self.kill()
            self._stderr.seek(0)
            raise StreamsFailure(f"subscriber process: expected {word}, got {line!r}; stderr: "
                                 f"{self._stderr.read().decode(errors='replace')[-1500:]}")
        return line.split(maxsplit=fields + 1 if fields >= 0 else -1)[1:]

    def _send(self, line: str) -> None:
        assert self.proc.stdin is not None  # a pipe
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def ready(self, timeout: float = 60) -> tuple[int, int, str]:
        """(streams answering 200 with the preamble, streams that did not, the first failure)."""
        ok, failed, error = self._expect("READY", timeout, fields=2)
        return int(ok), int(failed), json.loads(error)

    def wait(self, event_id: int, timeout: float) -> tuple[int, float, int]:
        """Wait until every open stream has ``event_id``: (streams still behind, seconds, streams closed)."""
        self._send(f"WAIT {event_id} {timeout}")
        behind, seconds, closed = self._expect("CAUGHT", timeout + 30)
        return int(behind), float(seconds), int(closed)

    def stop(self) -> Received:
        """Close every stream and collect what each received."""
        with tempfile.TemporaryDirectory(prefix="collector-streams-") as tmp:
            out = Path(tmp) / "received.marshal"
            self._send(f"STOP {out}")
            self._expect("DONE", 120)
            data = marshal.loads(out.read_bytes())
        self.proc.wait(timeout=30)
        streams = []
        for ids, times, status, error, ready in data[:-1]:
            a, b = array.array("q"), array.array("d")
            a.frombytes(ids)
            b.frombytes(times)
            streams.append(Stream(a, b, status, error, ready))
        return Received(streams, {k[0]: tuple(k[1:]) for k in data[-1]})

    def cpu_seconds(self) -> float:
        return cpu_seconds([self.proc.pid])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


# -- measuring ----------------------------------------------------------------------


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of ``pids`` so far (those still alive)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / CLK_TCK


def threads(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def newest_event(db_url: str) -> int:
    engine = create_engine(db_url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return conn.execute(text("SELECT coalesce(max(id), 0) FROM job_events")).scalar_one()
    finally:
        engine.dispose()


def events_after(db_url: str, after: int) -> dict[int, Key]:
    """Every committed event with id > ``after``: what each stream should have received."""
    engine = create_engine(db_url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text(
                "SELECT e.id, j.job_id, e.status, e.stage, e.message FROM job_events e"
                " JOIN jobs j ON j.id = e.job_pk WHERE e.id > :after ORDER BY e.id"), {"after": after}).all()
    finally:
        engine.dispose()
    return {row[0]: tuple(row[1:]) for row in rows}


@dataclasses.dataclass
class Rss:
    sum_mib: float
    max_mib: float
    threads: list[int]


def rss(master: int) -> Rss:
    """VmRSS of gunicorn's workers (median of 0.5 s each), summed and the largest; their thread counts."""
    per = idle_rss(master)
    if not per:
        raise StreamsFailure(f"no gunicorn worker found under PID {master}")
    return Rss(sum(per.values()) / 1024, max(per.values()) / 1024, [threads(pid) or 0 for pid in sorted(per)])


@dataclasses.dataclass
class Phase:
    """Events of one load phase and how the streams received them."""

    expected: int  # events committed in the phase
    streams: int  # streams checked (every one that connected)
    missing: int  # (stream, event) pairs never received
    duplicates: int
    mismatched: int  # events the reference stream described differently from the database
    latencies_s: list[float]  # receipt - PUT response, per (stream, event); empty for a wrk phase
    unmatched: int  # paced PUTs answered 2xx whose event the reference never named


def check_phase(received: Received, events: dict[int, Key], puts: list[Put] | None) -> Phase:
    """Compare what each stream received in the id range of ``events`` with the database."""
    low, high = (min(events), max(events)) if events else (1, 0)
    expected = set(events)
    mismatched = sum(1 for event_id, key in events.items()
                     if event_id in received.reference and received.reference[event_id] != key)
    answered = {p.key: p.answered_at for p in puts or [] if 200 <= p.status < 300}
    put_at = {event_id: answered[key] for event_id, key in received.reference.items()
              if low <= event_id <= high and key in answered}
    missing = duplicates = 0
    latencies: list[float] = []
    streams = [s for s in received.streams if s.ready]
    for s in streams:
        got = [(i, t) for i, t in zip(s.ids, s.times, strict=True) if low <= i <= high]
        ids = {i for i, _ in got}
        duplicates += len(got) - len(ids)
        missing += len(expected - ids)
        if puts is not None:
            latencies.extend(t - put_at[i] for i, t in got if i in put_at)
    unmatched = len(answered) - len(put_at) if puts is not None else 0
    return Phase(len(events), len(streams), missing, duplicates, mismatched, latencies, unmatched)


@dataclasses.dataclass
class StreamsRun:
    subscribers: int
    rate: float
    duration: float
    rounds: int
    connected: list[int] = dataclasses.field(default_factory=list)
    paced: dict[bool, list[Paced]] = dataclasses.field(default_factory=lambda: {False: [], True: []})
    # wrk summaries (bench.run.Result: requests_per_s, p50_ms, p99_ms, non2xx, socket_errors) without streams,
    # with streams, and after the streams closed with the workers' feed readers still running
    max_load: dict[str, list] = dataclasses.field(default_factory=lambda: {"without": [], "with": [], "readers": []})
    paced_phases: list[Phase] = dataclasses.field(default_factory=list)
    max_phases: list[Phase] = dataclasses.field(default_factory=list)
    catch_up_s: list[float] = dataclasses.field(default_factory=list)
    # CPU during each phase, % of one core: (who, phase kind, "with"/"without") -> per round
    cpu: dict[tuple[str, str, str], list[float]] = dataclasses.field(default_factory=dict)
    rss: dict[str, list[Rss]] = dataclasses.field(default_factory=lambda: {"idle": [], "connected": [], "after": []})
    problems: list[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0


def machine_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of all CPUs so far (/proc/stat)."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    # user, nice, system, irq, softirq; not idle, iowait or steal (the hypervisor's, not ours)
    return values[0] + values[1] + values[2] + values[5] + values[6], sum(values[:8])


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def postgres_cpu_seconds() -> float:
    """CPU seconds of every PostgreSQL process on the machine, all databases: the postmasters' own and
    their reaped children's, plus each live child's, so backends that exit during a phase still count
    (the pool closes its overflow connections)."""
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/comm") as f:
                    if not f.read().startswith("postgres"):
                        continue
            except OSError:
                continue
            fields = _stat(int(entry))
            if fields:
                stats[int(entry)] = fields
    ticks = 0
    for fields in stats.values():
        ticks += int(fields[11]) + int(fields[12])
        if int(fields[1]) not in stats:  # a postmaster: add its reaped children
            ticks += int(fields[13]) + int(fields[14])
    return ticks / CLK_TCK


def tree_cpu_seconds() -> float:
    """CPU seconds of this process and every live descendant, each with its reaped children
    (wrk runs, workers replaced by a reload): all the bench's own processes."""
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields:
                stats[int(entry)] = fields
    children: dict[int, list[int]] = {}
    for pid, fields in stats.items():
        children.setdefault(int(fields[1]), []).append(pid)
    ticks, todo = 0, [os.getpid()]
    while todo:
        pid = todo.pop()
        if pid in stats:
            ticks += sum(int(v) for v in stats[pid][11:15])
        todo.extend(children.get(pid, []))
    return ticks / CLK_TCK


def fresh_workers(master: int, workers: int, old: set[int], timeout: float = 90) -> None:
    """Wait until ``master`` has ``workers`` workers, none of them in ``old``, each past post_worker_init
    (which starts the worker's second thread: the app is loaded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = worker_pids(master)
        if len(pids) == workers and not old & set(pids) and all((threads(p) or 0) >= 2 for p in pids):
            return
        time.sleep(0.1)
    raise StreamsFailure(f"gunicorn did not get {workers} fresh workers within {timeout:.0f} s "
                         f"(now {worker_pids(master)}, old {sorted(old)})")


def measure(url: str, token: str, master: int, db_url: str, *, subscribers: int, rate: float, duration: float,
            rounds: int, quick: bool, max_throughput: Callable[[float], object], env: dict[str, str],
            run_id: Callable[[], str]) -> StreamsRun:
    """Rounds of: paced PUTs and a wrk max-throughput run without streams, then the same with
    ``subscribers`` streams open (the order alternates per round, so drift cancels).

    A worker's feed reader starts with its first stream and never stops, so after every phase
    with streams the master is sent SIGHUP: each phase starts on fresh, warmed-up workers, and
    "without streams" means no reader either. Before that, one more max-throughput run (not in
    ``quick``) measures the readers alone, the streams closed.
    """
    started = time.monotonic()
    result = StreamsRun(subscribers, rate, duration, rounds)
    workers = (os.cpu_count() or 1) * 2  # deploy/gunicorn.conf.py's default (the bench sets no COLLECTOR_WORKERS)
    wait_s = max(10.0, duration * 4)
    cores = os.cpu_count() or 1

    def warm_up() -> None:
        fresh_workers(master, workers, set())
        if quick:
            paced_puts(url, token, rate=rate, duration=1, run=run_id())
        else:
            max_throughput(2)
            paced_puts(url, token, rate=rate, duration=2, run=run_id())

    def timed(kind: str, side: str, sub: Subscribers | None, fn):
        pids = worker_pids(master)
        t0 = time.monotonic()
        before = (cpu_seconds(pids), postgres_cpu_seconds(), sub.cpu_seconds() if sub else 0.0, machine_ticks(),
                  tree_cpu_seconds())
        out = fn()
        elapsed = time.monotonic() - t0
        busy, total = machine_ticks()
        pg, tree = postgres_cpu_seconds() - before[1], tree_cpu_seconds() - before[4]
        machine = cores * (busy - before[3][0]) / max(total - before[3][1], 1) * elapsed
        for who, value in (("workers", cpu_seconds(pids) - before[0]), ("postgres", pg),
                           ("subscribers", (sub.cpu_seconds() - before[2]) if sub else None), ("machine", machine),
                           # the kernel's threads and anything else running: another agent's tests, say
                           ("other", machine - tree - pg)):
            if value is not None:
                result.cpu.setdefault((who, kind, side), []).append(100 * value / elapsed)
        return out

    def paced(side: str, sub: Subscribers | None = None) -> Paced:
        out = timed("paced", side, sub, lambda: paced_puts(url, token, rate=rate, duration=duration, run=run_id()))
        result.paced[side == "with"].append(out)
        return out

    def without() -> None:
        paced("without")
        result.max_load["without"].append(timed("max", "without", None, lambda: max_throughput(duration)))

    def with_streams() -> None:
        result.rss["idle"].append(rss(master))
        sub = Subscribers(url, token, subscribers, time_limit=300 + 10 * duration, env=env)
        try:
            ok, failed, error = sub.ready()
            result.connected.append(ok)
            if failed:
                result.problems.append(f"{failed} of {subscribers} streams did not open: {error}")
            time.sleep(0.5)
            result.rss["connected"].append(rss(master))
            before = newest_event(db_url)
            puts = paced("with", sub)
            paced_events = events_after(db_url, before)
            if paced_events:
                sub.wait(max(paced_events), wait_s)
            result.max_load["with"].append(timed("max", "with", sub, lambda: max_throughput(duration)))
            max_events = events_after(db_url, max(paced_events, default=before))
            if max_events:
                behind, seconds, _closed = sub.wait(max(max_events), max(wait_s, 60))
                result.catch_up_s.append(seconds)
                if behind:
                    result.problems.append(
                        f"{behind} streams still behind {seconds:.0f} s after the max-throughput run")
            result.rss["after"].append(rss(master))
            received = sub.stop()
        finally:
            sub.kill()
        if not quick:
            result.max_load["readers"].append(timed("max", "readers", None, lambda: max_throughput(duration)))
        broken = [s.error for s in received.streams if s.ready and s.error]
        if broken:
            result.problems.append(f"{len(broken)} streams ended early: {broken[0]}")
        for phases, events, put_list, name in ((result.paced_phases, paced_events, puts.puts, "paced"),
                                               (result.max_phases, max_events, None, "max-throughput")):
            checked = check_phase(received, events, put_list)
            phases.append(checked)
            if checked.missing or checked.duplicates or checked.mismatched or checked.unmatched:
                result.problems.append(
                    f"{name} run: {checked.missing} missing, {checked.duplicates} duplicate (stream, event) pairs over "
                    f"{checked.streams} streams x {checked.expected} events; {checked.mismatched} events described "
                    f"unlike the database; {checked.unmatched} PUTs whose event the reference stream never named")

    warm_up()
    order = [side for r in range(rounds) for side in (("without", "with") if r % 2 == 0 else ("with", "without"))]
    for i, side in enumerate(order):
        if side == "with":
            with_streams()
            if i < len(order) - 1:
                old = set(worker_pids(master))
                os.kill(master, signal.SIGHUP)
                fresh_workers(master, workers, old)
                warm_up()
        else:
            without()
    for side in ("without", "with"):
        for p in result.paced[side == "with"]:
            if p.non2xx or p.socket_errors:
                result.problems.append(f"paced PUTs {side} streams: {p.non2xx} non-2xx, {p.socket_errors} socket "
                                       f"errors of {len(p.puts)}")
    for side, loads in result.max_load.items():
        for load in loads:
            if load.non2xx or load.socket_errors:
                result.problems.append(f"max-throughput PUTs ({side} streams): {load.non2xx} non-2xx, "
                                       f"{load.socket_errors} socket errors")
    result.seconds = time.monotonic() - started
    return result


def report(result: StreamsRun) -> list[tuple[str, float | None, float | None, str]]:
    """The table's rows: (measure, value, what it is compared with, target)."""
    med = statistics.median
    n, rate = result.subscribers, result.rate
    rows: list[tuple[str, float | None, float | None, str]] = []
    rows.append((f"streams open (200 and preamble) before the load, of {n} (worst round)",
                 min(result.connected, default=0), n, "all"))
    w, wo = result.paced[True], result.paced[False]
    rows.append((f"paced PUTs: achieved req/s of {rate:g}, fresh connections, with streams (vs without)",
                 med(p.achieved_rate for p in w), med(p.achieved_rate for p in wo), "-"))
    for pct in (50, 99):
        rows.append((f"paced PUTs: PUT p{pct} ms with streams (vs without)",
                     med(p.p_ms(pct) for p in w), med(p.p_ms(pct) for p in wo), "-"))
    lat = sorted(x for phase in result.paced_phases for x in phase.latencies_s)
    pairs = sum(p.streams * p.expected for p in result.paced_phases)
    if lat:
        for pct in (50, 99):
            rows.append((f"delivery ms p{pct}: stream receipt - PUT response, {len(lat):,} (stream, event) pairs",
                         _percentile(lat, pct) * 1000, None, "-" if pct == 50 else "<= 1000"))
        rows.append((f"delivery ms max (min {lat[0] * 1000:.1f}: a batch read can pick up an event before its "
                     "PUT's answer arrives)", lat[-1] * 1000, None, "-"))
    rows.append((f"events missing in the paced runs, of {pairs:,} (stream, event) pairs",
                 sum(p.missing for p in result.paced_phases), None, "0"))
    loads = {side: result.max_load[side] for side in result.max_load}
    rows.append(("max PUT req/s (wrk put, 16 fresh connections) with streams (vs without)",
                 med(r.requests_per_s for r in loads["with"]), med(r.requests_per_s for r in loads["without"]),
                 ">= 0.8"))
    rows.append(("max PUT p99 ms with streams (vs without)",
                 med(r.p99_ms for r in loads["with"]), med(r.p99_ms for r in loads["without"]), "-"))
    if loads["readers"]:
        rows.append(("max PUT req/s, streams closed but the workers' feed readers running (vs without)",
                     med(r.requests_per_s for r in loads["readers"]), med(r.requests_per_s for r in loads["without"]),
                     "-"))
    pairs = sum(p.streams * p.expected for p in result.max_phases)
    rows.append((f"events missing in the max-throughput runs, of {pairs:,} pairs",
                 sum(p.missing for p in result.max_phases), None, "0"))
    if result.catch_up_s:
        rows.append(("after the max-throughput run: s until every stream had its last event",
                     med(result.catch_up_s), None, "-"))
    labels = {"workers": "gunicorn workers", "postgres": "PostgreSQL (all databases)",
              "machine": "whole machine", "subscribers": "subscriber process",
              "other": "everything else (kernel threads, other users' processes)"}
    sides = {"with": "streams open", "readers": "streams closed, feed readers running"}

    def cpu(who: str, kind: str, side: str) -> float | None:
        values = result.cpu.get((who, kind, side))
        return med(values) if values else None

    def per_put(who: str, side: str) -> float | None:
        # CPU ms per PUT of each max-throughput run (its CPU and its wrk summary were recorded together)
        values = result.cpu.get((who, "max", side), [])
        pairs = list(zip(values, result.max_load[side], strict=False))  # no CPU recorded: no pairs
        return med(10 * c / r.requests_per_s for c, r in pairs) if pairs else None

    for who in ("workers", "subscribers", "postgres", "other"):
        rows.append((f"CPU % of a core, {labels[who]}, paced {rate:g}/s run with streams"
                     + (" (vs without)" if who != "subscribers" else ""),
                     cpu(who, "paced", "with"), cpu(who, "paced", "without"), "-"))
    for who in ("workers", "postgres"):
        for side in ("with", "readers"):
            if result.max_load[side]:
                rows.append((f"CPU ms per PUT, {labels[who]}, max-throughput run: {sides[side]} (vs no streams)",
                             per_put(who, side), per_put(who, "without"), "-"))
    rows.append(("CPU % of a core, subscriber process, max-throughput run", cpu("subscribers", "max", "with"), None,
                 "-"))
    for who in ("machine", "other"):
        rows.append((f"CPU % of a core, {labels[who]}, max-throughput run with streams (vs without)",
                     cpu(who, "max", "with"), cpu(who, "max", "without"), "-"))
    idle = result.rss["idle"]
    for key, label in (("connected", "streams open, idle"), ("after", "streams open, after the load")):
        if result.rss[key] and idle:
            rows.append((f"worker RSS sum MiB: {label} (vs no streams, idle)",
                         med(r.sum_mib for r in result.rss[key]), med(r.sum_mib for r in idle), "-"))
            rows.append((f"worker RSS max MiB: {label} (vs no streams, idle)",
                         med(r.max_mib for r in result.rss[key]), med(r.max_mib for r in idle), "-"))
    return rows


MAX_SIDES = {"without": "no streams", "with": "streams open", "readers": "streams closed, feed readers running"}


def notes(result: StreamsRun) -> list[str]:
    """Per-round detail printed under the table."""
    out = []
    for i, phase in enumerate(result.paced_phases):
        lat = sorted(phase.latencies_s)
        if lat:
            out.append(f"- streams round {i + 1}: {phase.expected} paced events x {phase.streams} streams, delivery "
                       f"p50 {_percentile(lat, 50) * 1000:.0f} ms, p99 {_percentile(lat, 99) * 1000:.0f} ms")
    for side, loads in result.max_load.items():
        if loads:
            out.append(f"- max PUT req/s, {MAX_SIDES[side]}, per round: "
                       + ", ".join(f"{r.requests_per_s:.0f}" for r in loads))
    if result.rss["connected"]:
        out.append(f"- worker threads with streams open (one per stream + the pool's), per worker: "
                   f"{result.rss['connected'][0].threads} (before: {result.rss['idle'][0].threads})")
    out.append(f"- streams scenario: {result.seconds:.0f} s, {result.rounds} round(s) of {result.duration:g} s phases")
    return out


if __name__ == "__main__":
    if sys.argv[1:2] != ["subscribe"] or len(sys.argv) != 7:
        raise SystemExit("usage: python -m bench.streams subscribe HOST PORT TOKEN COUNT TIME_LIMIT_S")
    _host, _port, _token, _count, _limit = sys.argv[2:]
    asyncio.run(_subscribe(_host, int(_port), _token, int(_count), float(_limit)))
