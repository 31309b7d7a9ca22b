"""A load client that records every acknowledged write, and a verifier that compares them with what is stored.

The client drives jobs the way srtctl does: a POST at submit time (201), PUTs through the
lifecycle (200), each with a newer ``updated_at``, and log chunks at their source offset,
every request on a fresh connection with a 5 s timeout. A write answered 5xx, or with no
answer at all, is recorded as a failure and sent again (a log chunk verbatim, at the same
offset) until it is acknowledged or ``retry_for`` runs out; a job then goes no further, as
a reporter that gave up would.

The verifier reads the database directly and the HTTP feed, and returns every problem it
finds as a sentence (an empty list means all is well), so a negative control can show
that it does find them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import random
import threading
import time
from collections import defaultdict
from typing import Any

import requests
from sqlalchemy import Engine
from sqlalchemy import select
from sqlalchemy import text

from collector.models import BlobChunk
from collector.models import BlobFile
from collector.models import Job
from collector.models import JobEvent
from collector.store import counts

TIMEOUT = 5.0  # the srtctl reporter's
LOG_FILE = "logs/worker-0.out"
CAPTURE_FILE = "captures/out-0.parquet"
BLOBS = ("log", "capture")  # the kinds of write that store bytes, not a lifecycle change
SUBMITTED = ("submitted", None, None)
# (status, stage, message) of each PUT, in the reporter's order: every one differs, so
# every one appends an event, and an event names the write it came from.
LIFECYCLE = (
    ("starting", "starting", "Job started on node-0"),
    ("starting", "head_infrastructure", "Head infrastructure ready"),
    ("workers", "workers", "Starting workers"),
    ("frontend", "frontend", "Starting frontend"),
    ("frontend", "frontend", "Inference endpoint ready"),
    ("benchmark", "benchmark", "Running benchmark"),
    ("completed", "cleanup", "Benchmark completed successfully"),
)
# A log chunk follows these PUTs (indexes into LIFECYCLE); a capture segment, in two
# chunks, follows the benchmark's.
LOG_AFTER = (1, 3, 5)
CAPTURE_AFTER = 5


def stamp(value: dt.datetime) -> str:
    return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


@dataclasses.dataclass
class Attempt:
    """One request of a write: when it went out, when it ended, and how."""

    started: float
    ended: float
    status: int | None  # None: no answer (connection refused or reset, timeout)
    error: str | None = None
    retry_after: str | None = None


@dataclasses.dataclass
class Write:
    """One write a reporter wants stored: a POST, a PUT or a log chunk."""

    kind: str  # "post" | "put" | "log" | "capture"
    job_id: str
    step: int  # order within the job: the POST is 0, the PUTs 1.., a chunk shares its PUT's number
    at: dt.datetime | None = None  # submitted_at / updated_at
    triple: tuple[str, str | None, str | None] | None = None
    file: str | None = None
    offset: int | None = None
    data: bytes = b""
    total: int | None = None  # a capture segment's size
    body: dict | None = None
    attempts: list[Attempt] = dataclasses.field(default_factory=list)
    acked: bool = False

    @property
    def sent(self) -> bool:
        return bool(self.attempts)

    @property
    def moment(self) -> dt.datetime:
        """``at`` of a POST or a PUT (which always carry one)."""
        assert self.at is not None, self
        return self.at

    @property
    def changes_job(self) -> bool:
        """A POST or a PUT, not bytes."""
        return self.kind not in BLOBS

    @property
    def place(self) -> tuple[str, int]:
        """(file, offset) of a log chunk (which always has both)."""
        assert self.file is not None and self.offset is not None, self
        return self.file, self.offset


class Load:
    """Threads driving jobs through a collector; ``url`` may be changed while they run (a restarted server)."""

    def __init__(self, url: str, *, prefix: str, cluster: str = "faults", threads: int = 6, jobs: int | None = None,
                 retry_for: float = 15.0, token: str | None = None, pause: float = 0.0, seed: int = 14,
                 unposted: int = 0) -> None:
        self.url = url
        # Every ``unposted``-th job sends no POST (it never arrived): its first PUT makes the placeholder.
        self.unposted = unposted
        self.prefix = prefix
        self.cluster = cluster
        self.threads = threads
        self.max_jobs = jobs
        self.retry_for = retry_for
        self.token = token
        self.pause = pause
        self.writes: list[Write] = []
        self.rejections: list[tuple[Write, int, str]] = []  # answers that are neither 2xx nor 5xx
        self.started = time.monotonic()
        self._rand = random.Random(seed)
        self._numbers = itertools.count()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._base = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(hours=2)

    # --- driving -------------------------------------------------------------------------

    def start(self) -> Load:
        self.started = time.monotonic()
        for n in range(self.threads):
            thread = threading.Thread(target=self._run, name=f"faultload-{n}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self, timeout: float = 30.0) -> Load:
        """Start no new write; wait for the threads to finish (or give up on) the one they hold."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(timeout=max(0.1, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in self._threads), "load threads did not stop"
        return self

    def wait(self, timeout: float = 30.0) -> Load:
        """Wait until a load of ``jobs`` jobs is done."""
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(timeout=max(0.1, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in self._threads), "load did not finish in time"
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            number = next(self._numbers)
            if self.max_jobs is not None and number >= self.max_jobs:
                return
            self.drive(number)

    def job_writes(self, number: int) -> list[Write]:
        """The writes of job ``number`` in the order the reporter sends them (none sent yet)."""
        job_id = f"{self.prefix}{number}"
        submitted = self._base + dt.timedelta(seconds=number)
        posted = not (self.unposted and number % self.unposted == 0)
        writes = [Write("post", job_id, 0, submitted, SUBMITTED, body={
            "job_id": job_id, "job_name": f"fault-{number}", "submitted_at": stamp(submitted),
            "cluster": self.cluster, "recipe": "recipes/faults.yaml",
            "metadata": {"version": "1", "model": {"path": "m", "container": "c", "precision": "fp8"},
                         "resources": {"gpu_type": "h100", "gpus_per_node": 8, "prefill_nodes": 1,
                                       "decode_nodes": 1, "prefill_workers": 1, "decode_workers": 1},
                         "backend_type": "sglang", "frontend_type": "dynamo",
                         "benchmark": {"type": "sa-bench", "isl": 1024, "osl": 1024}},
        })] if posted else []
        offset = 0
        for step, (status, stage, message) in enumerate(LIFECYCLE, start=1):
            at = submitted + dt.timedelta(minutes=step)
            metadata: dict[str, Any] = {"cluster": self.cluster}
            body: dict[str, Any] = {"status": status, "stage": stage, "message": message, "updated_at": stamp(at),
                                    "metadata": metadata}
            if step == 1:
                body["started_at"] = stamp(at)
                metadata.update(head_node="node-0", log_dir=f"/logs/{job_id}", job_name=f"fault-{number}",
                                backend_type="sglang", frontend_type="dynamo",
                                resources={"gpu_type": "h100", "gpus_per_node": 8},
                                benchmark={"type": "sa-bench"})
            if status == "completed":
                body.update(completed_at=stamp(at), exit_code=0)
            writes.append(Write("put", job_id, step, at, (status, stage, message), body=body))
            if step - 1 in LOG_AFTER:
                lines = self._rand.randint(8, 60)
                data = "".join(f"{job_id} step {step} line {n}: tokens/s {n * 97 % 1000}\n"
                               for n in range(lines)).encode()
                writes.append(Write("log", job_id, step, file=LOG_FILE, offset=offset, data=data))
                offset += len(data)
            if step - 1 == CAPTURE_AFTER:
                segment = self._rand.randbytes(self._rand.randint(2_000, 20_000))
                half = len(segment) // 2
                writes += [Write("capture", job_id, step, file=CAPTURE_FILE, offset=start, data=segment[start:end],
                                 total=len(segment)) for start, end in ((0, half), (half, len(segment)))]
        return writes

    def drive(self, number: int, writes: list[Write] | None = None) -> None:
        """Send one job's writes in order; stop at the first one never acknowledged."""
        for write in writes or self.job_writes(number):
            if self._stop.is_set():
                return
            with self._lock:
                self.writes.append(write)
            if not self.send(write):
                return
            if self.pause:
                time.sleep(self.pause)

    def send(self, write: Write, *, retry: bool = True) -> bool:
        """Send ``write`` until it is acknowledged; whether it was."""
        first = time.monotonic()
        while True:
            attempt = self._attempt(write)
            write.attempts.append(attempt)
            if attempt.status is not None and 200 <= attempt.status < 300:
                write.acked = True
                return True
            if attempt.status is not None and attempt.status < 500:
                with self._lock:
                    self.rejections.append((write, attempt.status, attempt.error or ""))
                return False
            if not retry or time.monotonic() - first > self.retry_for:
                return False
            time.sleep(0.05 + self._rand.random() * 0.15)

    def _attempt(self, write: Write) -> Attempt:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        url = self.url
        args: dict[str, Any]
        if write.kind == "post":
            args = dict(method="POST", url=f"{url}/api/jobs", json=write.body)
        elif write.kind == "put":
            args = dict(method="PUT", url=f"{url}/api/jobs/{write.job_id}", json=write.body)
        else:
            params = {"file": write.file, "offset": write.offset, "cluster": self.cluster}
            if write.kind == "capture":
                params["total"] = write.total
            args = dict(method="POST", url=f"{url}/api/jobs/{write.job_id}/{write.kind}s", data=write.data,
                        params=params, headers={**headers, "Content-Type": "application/octet-stream"})
        args.setdefault("headers", headers)
        started = time.monotonic()
        try:
            # requests.request opens a session per call: a fresh connection, as the reporter's.
            response = requests.request(**args, timeout=TIMEOUT, allow_redirects=False)
        except requests.RequestException as exc:
            return Attempt(started, time.monotonic(), None, type(exc).__name__)
        expected = 201 if write.kind == "post" else 200
        status = response.status_code
        error = None if status == expected else response.text[:300]
        if 200 <= status < 300 and status != expected:
            status = -status  # a success code the reporter would not take: a rejection
        return Attempt(started, time.monotonic(), status, error, response.headers.get("Retry-After"))

    # --- what happened -------------------------------------------------------------------

    @property
    def acked(self) -> list[Write]:
        return [w for w in self.writes if w.acked]

    @property
    def failures(self) -> list[tuple[Write, Attempt]]:
        """Every attempt answered 5xx or not at all."""
        return [(w, a) for w in self.writes for a in w.attempts if a.status is None or a.status >= 500]

    def failure_kinds(self) -> dict[str, int]:
        kinds: dict[str, int] = defaultdict(int)
        for _, attempt in self.failures:
            kinds[str(attempt.status) if attempt.status else attempt.error or "no answer"] += 1
        return dict(kinds)

    def acks_between(self, start: float, end: float) -> int:
        return sum(1 for w in self.writes for a in w.attempts
                   if a.status is not None and 200 <= a.status < 300 and start <= a.ended < end)

    def first_ack_after(self, moment: float) -> float | None:
        """When the first attempt sent after ``moment`` was acknowledged (monotonic clock)."""
        ends = [a.ended for w in self.writes for a in w.attempts
                if a.status is not None and 200 <= a.status < 300 and a.started >= moment]
        return min(ends) if ends else None

    def longest_silence(self) -> float:
        """The longest time between two acknowledgements while the load ran."""
        ends = sorted(a.ended for w in self.writes for a in w.attempts
                      if a.status is not None and 200 <= a.status < 300)
        return max((b - a for a, b in itertools.pairwise(ends)), default=0.0)

    def summary(self) -> str:
        elapsed = max((a.ended for w in self.writes for a in w.attempts), default=self.started) - self.started
        jobs = len({w.job_id for w in self.writes})
        return (f"{len(self.acked)} writes acknowledged ({jobs} jobs) in {elapsed:.1f} s, "
                f"{len(self.failures)} failed attempts {self.failure_kinds()}, "
                f"longest silence {self.longest_silence():.2f} s")


# --- verifying ---------------------------------------------------------------------------


@dataclasses.dataclass
class Report:
    problems: list[str]
    jobs: int = 0
    events: int = 0
    log_bytes: int = 0
    capture_bytes: int = 0
    feed_events: int = 0

    def __str__(self) -> str:
        head = (f"{self.jobs} jobs, {self.events} events, {self.log_bytes} log bytes, "
                f"{self.capture_bytes} capture bytes, "
                f"{self.feed_events} feed events checked")
        if not self.problems:
            return head + ": all acknowledged writes stored"
        return head + f"; {len(self.problems)} problems:\n  " + "\n  ".join(self.problems[:40])


def verify(engine: Engine, writes: list[Write], *, url: str | None, cluster: str = "faults",
           ordered: bool = True, token: str | None = None) -> Report:
    """Compare ``writes`` (as recorded by a Load) with the database and, given ``url``, the HTTP feed.

    ``ordered``: each job's writes were sent one after another (every stored event is one
    of them, in their order); otherwise they raced, and the rule is that a job never goes
    back to an older update.
    """
    report = Report(problems=[])
    by_job: dict[str, list[Write]] = defaultdict(list)
    for write in writes:
        by_job[write.job_id].append(write)
    stored = _stored(engine, cluster, list(by_job))
    for job_id, job_writes in sorted(by_job.items()):
        job_writes.sort(key=lambda w: (w.step, w.kind != "post", not w.changes_job))
        _check_job(report, job_id, job_writes, stored, ordered)
    _check_counts(report, engine)
    if url is not None:
        _check_feed(report, engine, url, token)
    return report


def _stored(engine: Engine, cluster: str, job_ids: list[str]) -> dict:
    jobs_t, events_t = Job.__table__, JobEvent.__table__
    files_t, chunks_t = BlobFile.__table__, BlobChunk.__table__
    with engine.connect() as conn:
        rows = {r.job_id: r for r in conn.execute(select(jobs_t).where(jobs_t.c.cluster == cluster))}
        wanted = {rows[j].id: j for j in job_ids if j in rows}
        events: dict[str, list] = defaultdict(list)
        for event in conn.execute(select(events_t).order_by(events_t.c.id)):
            if event.job_pk in wanted:
                events[wanted[event.job_pk]].append(event)
        files: dict[tuple[str, str], dict] = {}
        for file in conn.execute(select(files_t)):
            if file.job_pk in wanted:
                chunks = conn.execute(select(chunks_t).where(chunks_t.c.file_id == file.id)
                                      .order_by(chunks_t.c.start_offset)).all()
                files[(wanted[file.job_pk], file.name)] = {"size": file.size, "done": file.done,
                                                           "total": file.total, "chunks": chunks}
    return {"jobs": rows, "events": events, "files": files}


def _check_job(report: Report, job_id: str, writes: list[Write], stored: dict, ordered: bool) -> None:
    problems = report.problems
    row = stored["jobs"].get(job_id)
    events = stored["events"].get(job_id, [])
    report.events += len(events)
    changes = [w for w in writes if w.changes_job]
    acked = [w for w in changes if w.acked]
    if row is None:
        if acked:
            problems.append(f"{job_id}: missing, with {len(acked)} acknowledged writes")
        return
    report.jobs += 1
    triples = [(e.status, e.stage, e.message) for e in events]
    if len(set(triples)) != len(triples):
        problems.append(f"{job_id}: duplicate events {triples}")
    sent = {w.triple: w for w in changes if w.sent}
    for event, triple in zip(events, triples, strict=True):
        write = sent.get(triple)
        if write is None:
            problems.append(f"{job_id}: event {event.id} {triple} matches no write sent")
        elif event.created_at != write.at:
            problems.append(f"{job_id}: event {event.id} {triple} stamped {event.created_at}, "
                            f"the write said {write.at}")
    # Sent in order, every acknowledged write appended its event; racing, a late one must not
    # have, and only the newest acknowledged update surely did.
    for write in acked if ordered else sorted(acked, key=lambda w: w.moment)[-1:]:
        if write.triple not in triples:
            problems.append(f"{job_id}: acknowledged {write.kind} {write.triple} has no event")
    if triples and (row.status, row.stage, row.message) != triples[-1]:
        problems.append(f"{job_id}: row shows {(row.status, row.stage, row.message)}, last event {triples[-1]}")
    applied = [sent[t] for t in triples if t in sent]
    if ordered:
        order = [w.triple for w in changes]
        positions = [order.index(t) for t in triples if t in order]
        if positions != sorted(positions):
            problems.append(f"{job_id}: events out of order {triples}")
        # Sent one after another, so only the write after the last acknowledged one can be
        # stored unacknowledged (its answer was lost).
        last_acked = acked[-1] if acked else None
        allowed = {last_acked.triple} if last_acked else set()
        allowed |= {w.triple for w in changes if w.sent and not w.acked
                    and (last_acked is None or w.step > last_acked.step)}
        if triples and triples[-1] not in allowed:
            problems.append(f"{job_id}: ends at {triples[-1]}, its last acknowledged write was "
                            f"{last_acked.triple if last_acked else None}")
    else:
        stamps = [e.created_at for e in events]
        if any(b <= a for a, b in itertools.pairwise(stamps)):
            problems.append(f"{job_id}: went back to an older update: {list(zip(triples, stamps, strict=True))}")
        newest = max(acked + applied, key=lambda w: w.moment, default=None)
        if newest is not None and (row.status, row.stage, row.message) != newest.triple:
            problems.append(f"{job_id}: ends at {(row.status, row.stage, row.message)}, "
                            f"its newest acknowledged update is {newest.triple}")
    if changes and changes[0].kind == "put":
        # No POST: the first PUT made the row, named by its metadata (else job-<id>), first
        # seen when it started or reported, whichever is earlier.
        first = changes[0]
        assert first.body is not None
        reported = (first.body.get("metadata") or {}).get("job_name")
        name = reported if isinstance(reported, str) and reported else f"job-{job_id}"
        started = first.body.get("started_at")
        seen = min(first.moment, dt.datetime.fromisoformat(started)) if started else first.moment
        if (row.is_placeholder, row.job_name, row.submitted_at) != (True, name, seen):
            problems.append(f"{job_id}: placeholder {(row.is_placeholder, row.job_name, row.submitted_at)}, "
                            f"its first PUT said {name} at {seen}")
    newest_applied = max((w.moment for w in applied), default=None)
    if newest_applied is not None and row.updated_at != newest_applied:
        problems.append(f"{job_id}: updated_at {row.updated_at}, newest applied update {newest_applied}")
    _check_blobs(report, job_id, [w for w in writes if not w.changes_job], stored)


def _check_blobs(report: Report, job_id: str, chunks: list[Write], stored: dict) -> None:
    by_file: dict[str, list[Write]] = defaultdict(list)
    for chunk in chunks:
        by_file[chunk.place[0]].append(chunk)
    for name, sent in by_file.items():
        acked = b"".join(c.data for c in sorted(sent, key=lambda c: c.place[1]) if c.acked)
        pending = [c for c in sent if c.sent and not c.acked]
        file = stored["files"].get((job_id, name))
        data = b""
        if file is not None:
            for chunk in file["chunks"]:
                if chunk.start_offset != len(data):
                    report.problems.append(f"{job_id} {name}: gap or overlap at {len(data)}")
                    break
                data += chunk.data
            if file["size"] != len(data):
                report.problems.append(f"{job_id} {name}: size {file['size']}, {len(data)} bytes stored")
            if file["total"] is not None and file["done"] != (len(data) == file["total"]):
                report.problems.append(f"{job_id} {name}: done is {file['done']} at {len(data)} of {file['total']}")
        if sent[0].kind == "capture":
            report.capture_bytes += len(data)
        else:
            report.log_bytes += len(data)
        # A chunk whose answer was lost may be stored; it is the one right after the acknowledged bytes.
        allowed = [acked] + [acked + c.data for c in pending if c.offset == len(acked)]
        if data not in allowed:
            # Shorter than the other: they differ where it ends (strict=False).
            where = next((i for i, (a, b) in enumerate(zip(data, acked, strict=False)) if a != b),
                         min(len(data), len(acked)))
            report.problems.append(f"{job_id} {name}: {len(data)} bytes stored, {len(acked)} acknowledged; "
                                   f"they differ from byte {where}")


def _check_counts(report: Report, engine: Engine) -> None:
    with engine.connect() as conn:
        kept = {(c, s): n for c, statuses in counts.by_cluster(conn).items() for s, n in statuses.items()}
        real = {(c, s): n for c, s, n in conn.execute(
            text("SELECT cluster, status, count(*) FROM jobs GROUP BY cluster, status"))}
    if kept != real:
        report.problems.append(f"the counts {kept} differ from the jobs table {real}")


def read_feed(url: str, token: str | None = None, page: int = 500) -> list[dict]:
    """Every event of ``GET /api/events``, paged with ``after=``."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    events: list[dict[str, Any]] = []
    after = 0
    while True:
        response = requests.get(f"{url}/api/events", params={"after": after, "limit": page}, headers=headers,
                                timeout=10)
        response.raise_for_status()
        batch = response.json()["events"]
        if not batch:
            return events
        events.extend(batch)
        after = batch[-1]["id"]


def _check_feed(report: Report, engine: Engine, url: str, token: str | None) -> None:
    feed = read_feed(url, token)
    report.feed_events = len(feed)
    ids = [e["id"] for e in feed]
    if any(b <= a for a, b in itertools.pairwise(ids)):
        report.problems.append("feed ids are not strictly increasing")
    with engine.connect() as conn:
        table = conn.execute(text(
            "SELECT e.id, j.job_id, e.status, e.stage, e.message FROM job_events e JOIN jobs j ON j.id = e.job_pk "
            "ORDER BY e.id")).all()
    stored_ids = [r.id for r in table]
    if ids != stored_ids:
        missing = sorted(set(stored_ids) - set(ids))
        extra = sorted(set(ids) - set(stored_ids))
        report.problems.append(f"feed differs from job_events: missing {missing[:20]}, extra {extra[:20]}")
        return
    for event, row in zip(feed, table, strict=True):
        if (event["job_id"], event["status"], event["stage"], event["message"]) != tuple(row[1:]):
            report.problems.append(f"feed event {event['id']} differs from its row: {event} vs {tuple(row)}")
            return
