"""The slowclients scenario: lifecycle PUTs while thousands of slow clients hold connections
open, through the shipped nginx config and, as the contrast, straight to gunicorn.

    python -m bench.run --only slowclients --backends postgres

nginx runs deploy/nginx/collector.conf as shipped, with a self-signed certificate and
loopback ports put in (as tests/test_deploy_proxy.py does) and an nginx.conf sized as the
file's header comment says. The slow clients are asyncio connections in this process:
half send a request line and then one header byte every ``interval`` seconds and never
end their headers; half send whole headers (with the write token) and then one body byte
every ``interval``. A client whose connection the server ends opens a new one, so the
number held stays the same. The writes are wrk's ``put`` mode on fresh connections,
measured without and then with the slow clients held, in every round; the figure is the
ratio of the medians. Every loop and wait is bounded in time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import resource
import shutil
import socket
import ssl
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import requests

from bench.blobs import rss_kib
from bench.blobs import worker_pids

ROOT = Path(__file__).resolve().parents[1]
NGINX_CONF = ROOT / "deploy" / "nginx" / "collector.conf"
# Sized as collector.conf's header says: 2 connections per proxied client, with room.
WORKER_CONNECTIONS = 8192
# Connections opened at once while the slow clients ramp up (a burst of thousands of
# SYNs would overflow the listen backlog and only measure the kernel's retry timer).
CONNECT_CONCURRENCY = 100
CONNECT_TIMEOUT = 10.0
# Padding that makes a slow body long enough never to finish within a phase.
BODY_BYTES = 2000


class SlowFailure(Exception):
    """The scenario could not set up (nginx, certificate, file descriptors)."""


def missing() -> str | None:
    """Why the scenario cannot run here, or None."""
    for name in ("nginx", "openssl"):
        if _binary(name) is None:
            return f"needs {name} (Debian package {name}; .ci/run installs it)"
    return None


def _binary(name: str) -> str | None:
    # Debian puts nginx in /usr/sbin, which a non-root PATH may lack.
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin")


def _found(name: str) -> str:
    """The path of a tool the scenario made sure is there (see above)."""
    path = _binary(name)
    assert path is not None, f"{name} not found"
    return path


def raise_fd_limit(needed: int) -> int:
    """Raise this process's soft RLIMIT_NOFILE to ``needed`` (children inherit it); returns the new limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            raise SlowFailure(f"{needed} file descriptors needed, the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
        soft = needed
    return soft


# ---------------------------------------------------------------- nginx


def _free_ports(count: int) -> list[int]:
    """Distinct free loopback ports (all bound at once, so none is handed out twice)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def make_certificate(directory: Path) -> None:
    """fullchain.pem and privkey.pem in ``directory``: a self-signed certificate for 127.0.0.1."""
    subprocess.run(
        [_found("openssl"), "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(directory / "privkey.pem"), "-out", str(directory / "fullchain.pem")],
        check=True, capture_output=True, timeout=30,
    )


def _substitute(text: str, replacements: dict[str, str]) -> str:
    """``text`` with each placeholder replaced; a placeholder the shipped file lacks is an error."""
    for old, new in replacements.items():
        if old not in text:
            raise SlowFailure(f"placeholder {old!r} is gone from {NGINX_CONF}")
        text = text.replace(old, new)
    return text


def nginx_config(root: Path, upstream: str, https_port: int, redirect_port: int) -> Path:
    """A throwaway nginx.conf under ``root`` that includes the shipped collector.conf with bench values."""
    (root / "tls").mkdir(parents=True)
    make_certificate(root / "tls")
    text = _substitute(NGINX_CONF.read_text(), {
        "/etc/letsencrypt/live/collector.example.org/": f"{root / 'tls'}/",
        "listen 443 ssl http2;": f"listen 127.0.0.1:{https_port} ssl http2;",
        "listen 80;": f"listen 127.0.0.1:{redirect_port};",
        "127.0.0.1:8080": upstream,
    })
    # Loopback IPv4 only (a container may have no IPv6).
    (root / "collector.conf").write_text(
        "".join(line for line in text.splitlines(keepends=True) if "listen [::]" not in line))
    temp = "\n".join(f"    {kind}_temp_path {root / kind};"
                     for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    # As root, nginx would run its workers as nobody, who cannot enter a 0700 temp dir.
    user = "user root;\n" if os.geteuid() == 0 else ""
    (root / "nginx.conf").write_text(f"""{user}worker_processes auto;
worker_rlimit_nofile {WORKER_CONNECTIONS * 2};
pid {root / 'nginx.pid'};
error_log {root / 'error.log'} warn;
events {{ worker_connections {WORKER_CONNECTIONS}; }}
http {{
    access_log {root / 'access.log'};
{temp}
    include {root / 'collector.conf'};
}}
""")
    return root / "nginx.conf"


class Nginx:
    """nginx in front of ``upstream`` (host:port) with the shipped config; stopped by PID."""

    def __init__(self, root: Path, upstream: str) -> None:
        https_port, redirect_port = _free_ports(2)
        self.root = root
        self.url = f"https://127.0.0.1:{https_port}"
        config = nginx_config(root, upstream, https_port, redirect_port)
        args = [_found("nginx"), "-p", f"{root}/", "-c", str(config), "-e", str(root / "error.log")]
        checked = subprocess.run([*args, "-t"], capture_output=True, text=True, timeout=30)
        if checked.returncode != 0:
            raise SlowFailure(f"nginx -t: {checked.stderr}")
        self.proc = subprocess.Popen([*args, "-g", "daemon off;"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        self._wait_serving()

    def _wait_serving(self) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SlowFailure(f"nginx exited with {self.proc.returncode}: {self.errors()}")
            try:
                requests.get(self.url + "/api/health", verify=False, timeout=2)
                return
            except requests.ConnectionError:
                time.sleep(0.05)
        self.stop()
        raise SlowFailure(f"nginx never served {self.url}: {self.errors()}")

    def errors(self) -> str:
        """The end of nginx's error log."""
        path = self.root / "error.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def rss_mib(self) -> float:
        """VmRSS of nginx's workers, summed, in MiB."""
        return sum(rss_kib(pid) or 0 for pid in worker_pids(self.proc.pid)) / 1024

    def stop(self) -> None:
        """SIGTERM (fast shutdown), then SIGKILL."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


# ---------------------------------------------------------------- slow clients


@dataclasses.dataclass
class Counts:
    """What the slow clients saw over one hold."""

    open: int = 0
    opened: int = 0
    # The server ended the connection: with an answer (e.g. 503 after the queue timeout,
    # 408), or without one (a timeout reset).
    answered: int = 0
    closed: int = 0
    connect_failures: int = 0


@dataclasses.dataclass
class Target:
    """Where the slow clients connect."""

    host: str
    port: int
    tls: ssl.SSLContext | None

    @classmethod
    def of(cls, url: str) -> Target:
        parts = urlsplit(url)
        context = None
        if parts.scheme == "https":
            # The bench's own throwaway certificate: nothing to verify.
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        assert parts.hostname is not None and parts.port is not None, url
        return cls(parts.hostname, parts.port, context)


KINDS = ("headers", "body")


def _requests(kind: str, i: int, host: str, token: str) -> tuple[bytes, bytes]:
    """(what is sent at once, what follows a byte at a time) for slow client ``i`` of ``kind``."""
    if kind == "headers":
        # Never ends its headers: what a slowloris sends.
        return f"PUT /api/jobs/slow-{i} HTTP/1.1\r\nHost: {host}\r\nX-Slow: ".encode(), b"a" * 100_000
    # Whole headers, then a valid PUT body a byte at a time: a reporter on a dying link.
    body = (b'{"status": "workers", "updated_at": "2025-01-26T10:40:00Z", "message": "'
            + b"x" * BODY_BYTES + b'"}')
    head = (f"PUT /api/jobs/slow-{i} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    return head, body


async def _dribble(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, rest: bytes, interval: float,
                   counts: Counts) -> None:
    """Send ``rest`` a byte per ``interval`` until the server answers or closes."""
    wait = random.uniform(0, interval)  # spread the bytes of thousands of clients over the interval
    for byte in rest:
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation that
            # arrives as the read completes, and the hold would then never stop.
            async with asyncio.timeout(wait):
                data = await reader.read(4096)
        except TimeoutError:
            writer.write(bytes([byte]))
            wait = interval
            continue
        if data:
            counts.answered += 1
        else:
            counts.closed += 1
        return
    await reader.read(4096)  # the whole request went out: read the answer, then start again


async def _slow_client(kind: str, i: int, target: Target, token: str, interval: float, counts: Counts,
                       gate: asyncio.Semaphore) -> None:
    """One slow client, reconnecting whenever the server ends its connection, until cancelled."""
    head, rest = _requests(kind, i, target.host, token)
    while True:
        try:
            async with gate, asyncio.timeout(CONNECT_TIMEOUT):
                reader, writer = await asyncio.open_connection(
                    target.host, target.port, ssl=target.tls, server_hostname=target.host if target.tls else None)
        except (OSError, TimeoutError):
            counts.connect_failures += 1
            await asyncio.sleep(interval)
            continue
        counts.open += 1
        counts.opened += 1
        try:
            writer.write(head)
            await _dribble(reader, writer, rest, interval, counts)
        except OSError:
            counts.closed += 1  # reset by the server
        finally:
            counts.open -= 1
            writer.transport.abort()


class Hold:
    """``n`` slow clients against ``url``, held from creation (in a running loop) until ``stop()``."""

    def __init__(self, url: str, n: int, token: str, interval: float) -> None:
        self.counts = {kind: Counts() for kind in KINDS}
        target = Target.of(url)
        gate = asyncio.Semaphore(CONNECT_CONCURRENCY)
        self.tasks = [asyncio.create_task(_slow_client(KINDS[i % 2], i, target, token, interval,
                                                       self.counts[KINDS[i % 2]], gate))
                      for i in range(n)]
        self.n = n

    def open(self) -> int:
        """Connections held right now."""
        return sum(c.open for c in self.counts.values())

    async def ramp(self, time_limit: float) -> float:
        """Wait until every client has connected once (or ``time_limit``); returns the seconds it took."""
        started = time.monotonic()
        while sum(c.opened for c in self.counts.values()) < self.n and time.monotonic() - started < time_limit:
            await asyncio.sleep(0.05)
        return time.monotonic() - started

    async def stop(self) -> None:
        """Cancel every client and wait (bounded) until all have closed their connections."""
        pending = set(self.tasks)
        for _ in range(20):
            for task in pending:
                task.cancel()
            _done, pending = await asyncio.wait(pending, timeout=0.5)
            if not pending:
                return
        raise SlowFailure(f"{len(pending)} slow clients did not stop")


# ---------------------------------------------------------------- the measurement


@dataclasses.dataclass
class Side:
    """One target's rounds: write results without and with the slow clients held."""

    name: str
    without: list = dataclasses.field(default_factory=list)
    with_: list = dataclasses.field(default_factory=list)
    holds: list[dict[str, Counts]] = dataclasses.field(default_factory=list)
    ramp_s: list[float] = dataclasses.field(default_factory=list)
    open_during: list[int] = dataclasses.field(default_factory=list)
    hold_s: list[float] = dataclasses.field(default_factory=list)
    rss_mib: tuple[float, float] | None = None  # nginx workers: idle, holding


@dataclasses.dataclass
class SlowRun:
    slow: int
    interval: float
    duration: float
    rounds: int
    sides: list[Side]
    problems: list[str]


async def _phase(side: Side, url: str, health: str, *, slow: int, token: str, interval: float, duration: float,
                 writes: Callable, before: Callable, rss: Callable | None) -> None:
    """One round on one target: writes alone, then writes while ``slow`` clients are held."""
    await asyncio.to_thread(before)
    side.without.append(await asyncio.to_thread(writes, url, duration))
    idle = await asyncio.to_thread(rss) if rss else None
    await asyncio.to_thread(before)
    hold = Hold(url, slow, token, interval)
    held = time.monotonic()
    try:
        side.ramp_s.append(await hold.ramp(60))
        # Every client has sent its first bytes and at least one more: all are mid-request.
        await asyncio.sleep(interval)
        side.open_during.append(hold.open())
        if rss and side.rss_mib is None:  # the first hold: nginx keeps memory it has grown to
            assert idle is not None  # measured above whenever rss is given
            side.rss_mib = (idle, await asyncio.to_thread(rss))
        side.with_.append(await asyncio.to_thread(writes, url, duration))
    finally:
        await hold.stop()
        side.hold_s.append(time.monotonic() - held)
        side.holds.append(hold.counts)
    await asyncio.to_thread(_wait_healthy, health, 60)


def _wait_healthy(url: str, time_limit: float) -> None:
    """Wait until ``url`` answers 200 again after a hold (gunicorn frees its threads as the clients go)."""
    deadline = time.monotonic() + time_limit
    while time.monotonic() < deadline:
        try:
            if requests.get(url, verify=False, timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise SlowFailure(f"{url} did not answer 200 within {time_limit:.0f} s of the slow clients closing")


def measure(upstream_url: str, token: str, work: Path, *, slow: int, interval: float, duration: float,
            rounds: int, direct: bool, warmup: bool, writes: Callable, before: Callable) -> SlowRun:
    """Rounds of (through nginx, then straight to gunicorn if ``direct``); ``writes(url, seconds)``
    returns a wrk Result and ``before()`` empties the tables."""
    raise_fd_limit(4 * slow + 4096)
    # The bench's self-signed certificate. requests re-exports urllib3 at run time; its stubs do not say so.
    requests.packages.urllib3.disable_warnings()  # type: ignore[attr-defined]
    nginx = Nginx(work / "nginx", upstream_url.removeprefix("http://"))
    sides = [Side("nginx")] + ([Side("gunicorn")] if direct else [])
    urls = {"nginx": nginx.url, "gunicorn": upstream_url}
    try:
        async def run() -> None:
            if warmup:
                # Pools, plans and TLS caches warm on both paths before anything is recorded.
                for side in sides:
                    await asyncio.to_thread(before)
                    await asyncio.to_thread(writes, urls[side.name], duration)
            for _ in range(rounds):
                for side in sides:
                    url = urls[side.name]
                    await _phase(side, url, url + "/api/health", slow=slow, token=token, interval=interval,
                                 duration=duration, writes=writes, before=before,
                                 rss=nginx.rss_mib if side.name == "nginx" else None)

        asyncio.run(run())
    finally:
        nginx.stop()
    problems = []
    for result in sides[0].without + sides[0].with_:
        if result.non2xx or result.socket_errors:
            problems.append(f"through nginx: {result.non2xx} non-2xx, {result.socket_errors} socket errors")
    if min(sides[0].open_during, default=0) < 0.95 * slow:
        problems.append(f"only {min(sides[0].open_during, default=0)} of {slow} slow clients held through nginx")
    if "worker_connections are not enough" in nginx.errors():
        problems.append("nginx ran out of worker_connections")
    return SlowRun(slow, interval, duration, rounds, sides, problems)


def report(result: SlowRun) -> list[tuple[str, float | None, float | None, str]]:
    """The table's rows: (measure, value, what it is compared with, target)."""
    med = statistics.median
    n = result.slow
    rows: list[tuple[str, float | None, float | None, str]] = []
    for side in result.sides:
        where = "through nginx" if side.name == "nginx" else "straight to gunicorn (contrast)"
        rows.append((f"{where}: PUT req/s with {n} slow clients (vs without)",
                     med(r.requests_per_s for r in side.with_), med(r.requests_per_s for r in side.without),
                     ">= 0.80" if side.name == "nginx" else "- (collapses)"))
        rows.append((f"{where}: PUT p99 ms with (vs without)",
                     med(r.p99_ms for r in side.with_), med(r.p99_ms for r in side.without), "-"))
        rows.append((f"{where}: failed PUTs with (non-2xx + socket errors; vs without)",
                     sum(r.non2xx + r.socket_errors for r in side.with_),
                     sum(r.non2xx + r.socket_errors for r in side.without), "0" if side.name == "nginx" else "-"))
        rows.append((f"{where}: slow clients open when the writes started (worst round, of {n})",
                     min(side.open_during), n, "all"))
        for kind in KINDS:
            rows.append((f"{where}: slow {kind} ended by the server per hold (answered + closed; median of "
                         f"{n // 2})", med(h[kind].answered + h[kind].closed for h in side.holds), None, "-"))
        if side.rss_mib:
            rows.append((f"{where}: nginx workers' RSS MiB holding {n} slow clients (vs idle)",
                         side.rss_mib[1], side.rss_mib[0], "-"))
    return rows


def notes(result: SlowRun) -> list[str]:
    """Lines under the table: how the holds went."""
    lines = [f"- slowclients: {result.rounds} round(s) × {result.duration:g} s per phase, a byte every "
             f"{result.interval:g} s per slow client, half in their headers and half in a body"]
    for side in result.sides:
        lines.append(f"- slowclients {side.name}: ramp {max(side.ramp_s):.1f} s (worst); hold seconds "
                     + ", ".join(f"{s:.0f}" for s in side.hold_s))
        for kind in KINDS:
            counts = [h[kind] for h in side.holds]
            lines.append(f"  - slow {kind}: connections opened {sum(c.opened for c in counts)}, answered "
                         f"{sum(c.answered for c in counts)}, closed without an answer "
                         f"{sum(c.closed for c in counts)}, connect failures "
                         f"{sum(c.connect_failures for c in counts)}")
    return lines
