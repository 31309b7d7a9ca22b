"""The blob scenarios' client side: a long log read from its start and its end, and a capture
segment downloaded while the server's workers are watched for memory.

Both upload their file through the API first (1 MiB chunks on one keep-alive session),
and check what they read back, so a fast wrong answer cannot pass as a fast one. Every
loop is bounded in count and in time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import random
import statistics
import threading
import time
import uuid

import requests

MiB = 1024 * 1024
LINE = 128
# Generous per-request timeout: the last chunk of a segment checksums the whole segment.
TIMEOUT = 120


class BlobFailure(Exception):
    """The collector answered non-2xx or something other than what was uploaded."""


def log_bytes(offset: int, size: int) -> bytes:
    """ASCII log lines of 128 bytes from file offset ``offset``; each starts with its own offset."""
    return b"".join(
        (b"%012d 2026-12-02T10:%02d:%02d.%03d [rank %d] step %d loss=%.4f throughput=%d tok/s" % (
            pos, (pos >> 13) % 60, (pos >> 7) % 60, pos % 997, (pos >> 7) % 16, pos >> 7, 1.0 / (1 + (pos >> 7)),
            (pos * 7919) % 100000)).ljust(LINE - 1) + b"\n"
        for pos in range(offset, offset + size, LINE)
    )


def _session(token: str) -> requests.Session:
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {token}"
    return session


def _check(response: requests.Response, what: str) -> None:
    if not 200 <= response.status_code < 300:
        raise BlobFailure(f"{what}: HTTP {response.status_code}: {response.text[:500]}")


def _percentile(samples: list[float], pct: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(samples)
    return ordered[max(math.ceil(pct / 100 * len(ordered)) - 1, 0)]


@dataclasses.dataclass
class Upload:
    bytes: int
    seconds: float

    @property
    def mb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e6


def upload_log(session: requests.Session, url: str, job_id: str, name: str, chunks: list[bytes],
               deadline: float) -> Upload:
    """POST ``chunks`` in order as one log file (final on the last)."""
    started, offset = time.perf_counter(), 0
    for i, chunk in enumerate(chunks):
        if time.monotonic() > deadline:
            raise BlobFailure(f"log upload passed its time limit at offset {offset}")
        params: dict[str, str | int] = {"file": name, "offset": offset}
        if i == len(chunks) - 1:
            params["final"] = 1
        r = session.post(f"{url}/api/jobs/{job_id}/logs", params=params, data=chunk,
                         headers={"Content-Type": "application/octet-stream"}, timeout=TIMEOUT)
        _check(r, f"POST log {name} at {offset}")
        if r.json().get("stored") != 1:
            raise BlobFailure(f"POST log {name} at {offset} stored nothing: {r.text[:200]}")
        offset += len(chunk)
    return Upload(offset, time.perf_counter() - started)


@dataclasses.dataclass
class Tail:
    file_bytes: int
    upload: Upload
    start_ms: list[float]
    end_ms: list[float]

    def p(self, which: str, pct: float) -> float:
        return _percentile(self.start_ms if which == "start" else self.end_ms, pct)


def logs_tail(url: str, token: str, *, file_mib: int, samples: int, warmup: int, time_limit: float) -> Tail:
    """Upload a ``file_mib`` MiB log, then time GETs of 1 MiB at offset 0 and at size - 1 MiB, interleaved."""
    deadline = time.monotonic() + time_limit
    job_id, name = f"tail-{uuid.uuid4().hex[:8]}", "logs/benchmark.out"
    chunks = [log_bytes(i * MiB, MiB) for i in range(file_mib)]
    size = file_mib * MiB
    with _session(token) as session:
        upload = upload_log(session, url, job_id, name, chunks, deadline)
        del chunks
        offsets = {"start": 0, "end": size - MiB}
        times: dict[str, list[float]] = {"start": [], "end": []}
        for i in range(warmup + samples):
            # Alternate which goes first, so neither always follows the other.
            for which in (("start", "end") if i % 2 == 0 else ("end", "start")):
                if time.monotonic() > deadline:
                    raise BlobFailure(f"logs_tail passed its {time_limit:.0f} s limit after {i} reads of each")
                offset = offsets[which]
                t0 = time.perf_counter()
                where: dict[str, str | int] = {"file": name, "offset": offset}
                r = session.get(f"{url}/api/jobs/{job_id}/logs", params=where, timeout=TIMEOUT)
                body = r.content
                elapsed_ms = (time.perf_counter() - t0) * 1000
                _check(r, f"GET log {name} at {offset}")
                _check_log_read(r.json(), offset, size, len(body))
                if i >= warmup:
                    times[which].append(elapsed_ms)
    return Tail(size, upload, times["start"], times["end"])


def _check_log_read(doc: dict, offset: int, size: int, body_len: int) -> None:
    data = doc.get("data", "")
    expected = log_bytes(offset, LINE).decode()
    if doc.get("offset") != offset or doc.get("next_offset") != offset + MiB or len(data) != MiB:
        raise BlobFailure(f"GET log at {offset} of a {size}-byte file: offset={doc.get('offset')} next_offset="
                          f"{doc.get('next_offset')} len(data)={len(data)} (body {body_len} bytes)")
    if not data.startswith(expected) or doc.get("size") != size:
        raise BlobFailure(f"GET log at {offset}: data starts {data[:40]!r}, expected {expected[:40]!r}; "
                          f"size={doc.get('size')}")


def worker_pids(master: int) -> list[int]:
    """The PIDs whose parent is ``master`` (gunicorn's workers)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # gone meanwhile
        # The command name may hold spaces and parentheses: the fields follow the last ")".
        if int(stat.rsplit(")", 1)[1].split()[1]) == master:
            pids.append(int(entry))
    return sorted(pids)


def rss_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


class RssSampler:
    """Samples VmRSS of every worker of a gunicorn master every ``interval`` s, keeping each one's peak."""

    def __init__(self, master: int, *, interval: float = 0.05, time_limit: float = 600) -> None:
        self.master, self.interval, self.time_limit = master, interval, time_limit
        self.peaks: dict[int, int] = {}
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _sample(self, pids: list[int]) -> None:
        for pid in pids:
            rss = rss_kib(pid)
            if rss is not None:
                self.peaks[pid] = max(self.peaks.get(pid, 0), rss)
        self.samples += 1

    def _run(self) -> None:
        deadline = time.monotonic() + self.time_limit
        pids, listed = worker_pids(self.master), time.monotonic()
        while time.monotonic() < deadline:
            self._sample(pids)
            if time.monotonic() - listed > 1:
                pids, listed = worker_pids(self.master), time.monotonic()
            if self._stop.wait(self.interval):
                break
        # Once more as it stops: a transfer shorter than the interval still gets a sample after it.
        self._sample(pids)


def idle_rss(master: int, *, seconds: float = 0.5, interval: float = 0.05) -> dict[int, int]:
    """Each worker's median RSS (KiB) over ``seconds`` of no requests."""
    pids = worker_pids(master)
    series: dict[int, list[int]] = {pid: [] for pid in pids}
    for _ in range(max(int(seconds / interval), 1)):
        for pid in pids:
            rss = rss_kib(pid)
            if rss is not None:
                series[pid].append(rss)
        time.sleep(interval)
    return {pid: int(statistics.median(s)) for pid, s in series.items() if s}


def growth_mib(idle: dict[int, int], peaks: dict[int, int]) -> float:
    """The largest growth of one worker's RSS over its idle RSS, in MiB."""
    grown = [peaks[pid] - idle[pid] for pid in peaks if pid in idle]
    if not grown:
        raise BlobFailure(f"no gunicorn worker was sampled (idle {idle}, peaks {peaks})")
    return max(max(grown), 0) / 1024


@dataclasses.dataclass
class Capture:
    file_bytes: int
    upload: Upload
    # The last chunk completes the segment (the collector checksums it then): its own latency.
    last_chunk_ms: float
    upload_growth_mib: float
    download_bytes: int
    download_seconds: float
    download_growth_mib: float
    workers: int
    samples: int

    @property
    def download_mb_per_s(self) -> float:
        return self.download_bytes / self.download_seconds / 1e6


def capture_rss(url: str, token: str, master: int, *, file_mib: int, time_limit: float) -> Capture:
    """Upload a ``file_mib`` MiB segment, then download it once while sampling every worker's RSS."""
    deadline = time.monotonic() + time_limit
    job_id, name = f"cap-{uuid.uuid4().hex[:8]}", "out-0.parquet"
    rng = random.Random(file_mib)
    # Random bytes: a parquet segment is compressed already, and TOAST's compression should not flatter it.
    chunks = [rng.randbytes(MiB) for _ in range(file_mib)]
    total = file_mib * MiB
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(chunk)
    with _session(token) as session:
        before_upload = idle_rss(master)
        with RssSampler(master, time_limit=time_limit) as sampler:
            started, offset, last_ms = time.perf_counter(), 0, 0.0
            for chunk in chunks:
                if time.monotonic() > deadline:
                    raise BlobFailure(f"capture upload passed its time limit at offset {offset}")
                t0 = time.perf_counter()
                chunk_at: dict[str, str | int] = {"file": name, "offset": offset, "total": total}
                r = session.post(f"{url}/api/jobs/{job_id}/captures", params=chunk_at, data=chunk,
                                 headers={"Content-Type": "application/octet-stream"}, timeout=TIMEOUT)
                last_ms = (time.perf_counter() - t0) * 1000
                _check(r, f"POST capture {name} at {offset}")
                offset += len(chunk)
                doc = r.json()
                if doc.get("next_offset") != offset or doc.get("complete") != (offset == total):
                    raise BlobFailure(f"POST capture at {offset - len(chunk)}: {doc}, expected next_offset {offset}"
                                      f" complete {offset == total}")
            upload = Upload(offset, time.perf_counter() - started)
        upload_growth = growth_mib(before_upload, sampler.peaks)
        del chunks

        before_download = idle_rss(master)
        got, received = hashlib.sha256(), 0
        with RssSampler(master, time_limit=time_limit) as sampler:
            started = time.perf_counter()
            with session.get(f"{url}/api/jobs/{job_id}/captures", params={"file": name}, stream=True,
                             timeout=TIMEOUT) as r:
                _check(r, f"GET capture {name}")
                announced = r.headers.get("X-Checksum-SHA256")
                for block in r.iter_content(chunk_size=MiB):
                    received += len(block)
                    got.update(block)
                    if received > total or time.monotonic() > deadline:
                        break
            seconds = time.perf_counter() - started
        download_growth = growth_mib(before_download, sampler.peaks)
    if received != total or got.hexdigest() != digest.hexdigest():
        raise BlobFailure(f"GET capture {name}: {received} bytes (sha256 {got.hexdigest()[:16]}...), uploaded "
                          f"{total} (sha256 {digest.hexdigest()[:16]}...)")
    if announced is not None and announced != digest.hexdigest():
        raise BlobFailure(f"GET capture {name}: X-Checksum-SHA256 {announced}, but the bytes hash to "
                          f"{digest.hexdigest()}")
    return Capture(total, upload, last_ms, upload_growth, received, seconds, download_growth, len(before_download),
                   sampler.samples)
