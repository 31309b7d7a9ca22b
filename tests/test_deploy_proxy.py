"""deploy/nginx and deploy/caddy run for real in front of a live collector: TLS, streams, the /status/ proxy."""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import ssl
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests import sse
from tests.processes import ROOT

DEPLOY = ROOT / "deploy"
PAGE = (ROOT / "ui" / "index.html").read_bytes()
MIB = 1024 * 1024
FAST = {"stream_heartbeat_s": 0.3, "stream_poll_s": 0.1}
BODY = {"status": "workers", "updated_at": "2025-01-26T10:35:00Z"}


def _binary(name: str) -> str | None:
    # Debian puts nginx in /usr/sbin, which a non-root PATH may lack.
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin")


def _free_ports(*names: str) -> dict[str, int]:
    """One distinct free loopback port per name.

    The sockets stay bound until every port is picked: picked one at a time, the
    kernel may hand out the same port twice, and then nginx's redirect server
    answers on the /status/ port with a 301.
    """
    sockets = [socket.socket() for _ in names]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        ports = {name: sock.getsockname()[1] for name, sock in zip(names, sockets, strict=True)}
    finally:
        for sock in sockets:
            sock.close()
    assert len(set(ports.values())) == len(names), ports
    return ports


def _substitute(text: str, replacements: dict[str, str]) -> str:
    """``text`` with each placeholder replaced; a placeholder the file lacks is a test failure."""
    for old, new in replacements.items():
        assert old in text, f"placeholder {old!r} is gone from the shipped file"
        text = text.replace(old, new)
    return text


@pytest.fixture
def tls(tmp_path) -> Path:
    """A directory holding fullchain.pem and privkey.pem, a self-signed certificate for 127.0.0.1."""
    directory = tmp_path / "tls"
    directory.mkdir()
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("needs the openssl command (Debian package openssl) to make a test certificate")
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(directory / "privkey.pem"), "-out", str(directory / "fullchain.pem")],
        check=True, capture_output=True,
    )
    return directory


@dataclasses.dataclass
class Proxy:
    """A running proxy: its TLS front for the collector and its /status/ server, plus the collector behind."""

    name: str
    https: str  # collector.conf / Caddyfile
    status: str  # status-proxy.conf / status-proxy.Caddyfile
    cafile: str
    collector: object  # the LiveServer behind it
    read_token: str
    redirect: str | None = None  # nginx's plain-HTTP server, which only redirects

    def get(self, url: str, **kwargs) -> requests.Response:
        kwargs.setdefault("timeout", 10)
        kwargs.setdefault("allow_redirects", False)
        return requests.get(url, verify=self.cafile, **kwargs)

    def stream(self, base: str, path: str, *, token: str | None = None) -> sse.Stream:
        """An event stream through the proxy (over TLS for the https front)."""
        host, port = base.split("://")[1].split(":")
        sock = socket.create_connection((host, int(port)), timeout=10)
        try:
            if base.startswith("https"):
                sock = ssl.create_default_context(cafile=self.cafile).wrap_socket(sock, server_hostname=host)
            lines = [f"GET {path} HTTP/1.1", f"Host: {host}:{port}", "Accept: text/event-stream"]
            if token:
                lines.append(f"Authorization: Bearer {token}")
            sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
            return sse.Stream(sock, 10)
        except BaseException:
            sock.close()
            raise


def _wait_until_serving(proc: subprocess.Popen, url: str, cafile: str, log: Path) -> None:
    program = proc.args[0] if isinstance(proc.args, list) else proc.args
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{program!s} exited with {proc.returncode}:\n{log.read_text()}")
        try:
            requests.get(url, verify=cafile, timeout=2)
            return
        except requests.ConnectionError:
            time.sleep(0.05)
    raise RuntimeError(f"{program!s} never served {url}:\n{log.read_text()}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


# ---------------------------------------------------------------- nginx


def nginx_config(tmp_path: Path, tls: Path, upstream: str, read_token: str, ports: dict[str, int]) -> Path:
    """A throwaway nginx.conf under ``tmp_path`` that includes both shipped files with test values."""
    root = tmp_path / "nginx"
    (root / "secrets").mkdir(parents=True)
    token_file = root / "secrets" / "collector-read-token.conf"
    token_file.write_text(f'proxy_set_header Authorization "Bearer {read_token}";\n')
    token_file.chmod(0o600)
    main = _substitute((DEPLOY / "nginx" / "collector.conf").read_text(), {
        "/etc/letsencrypt/live/collector.example.org/": f"{tls}/",
        "listen 443 ssl http2;": f"listen 127.0.0.1:{ports['https']} ssl http2;",
        "listen 80;": f"listen 127.0.0.1:{ports['redirect']};",
        "127.0.0.1:8080": upstream,
    })
    status = _substitute((DEPLOY / "nginx" / "status-proxy.conf").read_text(), {
        "listen 80;": f"listen 127.0.0.1:{ports['status']};",
        "127.0.0.1:8080": upstream,
        "/etc/nginx/secrets/collector-read-token.conf": str(token_file),
    })
    # The test binds loopback IPv4 only (a container may have no IPv6).
    for name, text in (("collector.conf", main), ("status-proxy.conf", status)):
        (root / name).write_text("".join(line for line in text.splitlines(keepends=True) if "listen [::]" not in line))
    temp = "\n".join(f"    {kind}_temp_path {root / kind};"
                     for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    # As root, nginx would run its workers as nobody, who cannot enter pytest's 0700 tmp dirs.
    user = "user root;\n" if os.geteuid() == 0 else ""
    (root / "nginx.conf").write_text(f"""{user}worker_processes 1;
pid {root / 'nginx.pid'};
error_log {root / 'error.log'} info;
events {{ worker_connections 256; }}
http {{
    access_log {root / 'access.log'};
{temp}
    include {root / 'collector.conf'};
    include {root / 'status-proxy.conf'};
}}
""")
    return root


def run_nginx(tmp_path, tls, collector, read_token) -> Iterator[Proxy]:
    nginx = _binary("nginx")
    if nginx is None:
        pytest.skip("needs nginx (Debian package nginx; .ci/run installs it)")
    ports = _free_ports("https", "redirect", "status")
    upstream = collector.url.removeprefix("http://")
    root = nginx_config(tmp_path, tls, upstream, read_token, ports)
    args = [nginx, "-p", f"{root}/", "-c", str(root / "nginx.conf"), "-e", str(root / "error.log")]
    checked = subprocess.run([*args, "-t"], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    assert "test is successful" in checked.stderr
    proc = subprocess.Popen([*args, "-g", "daemon off;"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        proxy = Proxy("nginx", f"https://127.0.0.1:{ports['https']}", f"http://127.0.0.1:{ports['status']}",
                      str(tls / "fullchain.pem"), collector, read_token, f"http://127.0.0.1:{ports['redirect']}")
        _wait_until_serving(proc, proxy.https + "/api/health", proxy.cafile, root / "error.log")
        yield proxy
    finally:
        _stop(proc)


# ---------------------------------------------------------------- Caddy


def caddy_config(tmp_path: Path, tls: Path, upstream: str, read_token: str, ports: dict[str, int]) -> Path:
    """A throwaway Caddyfile: test-only global options, then both shipped files with test values."""
    root = tmp_path / "caddy"
    (root / "secrets").mkdir(parents=True)
    token_file = root / "secrets" / "collector-read-token.caddy"
    token_file.write_text(f'header_up Authorization "Bearer {read_token}"\n')
    token_file.chmod(0o600)
    main = _substitute((DEPLOY / "caddy" / "Caddyfile").read_text(), {
        "\ncollector.example.org {\n":
            f"\nhttps://127.0.0.1:{ports['https']} {{\n\ttls {tls / 'fullchain.pem'} {tls / 'privkey.pem'}\n",
        "127.0.0.1:8080": upstream,
    })
    status = _substitute((DEPLOY / "caddy" / "status-proxy.Caddyfile").read_text(), {
        "\nstatus.example.org {\n": f"\nhttp://127.0.0.1:{ports['status']} {{\n",
        "127.0.0.1:8080": upstream,
        "/etc/caddy/secrets/collector-read-token.caddy": str(token_file),
        "/opt/collector/ui": str(ROOT / "ui"),
    })
    # No admin socket, no ACME, no redirect listener on :80, state kept in tmp_path.
    globals_ = f"""{{
\tadmin off
\tauto_https disable_redirects
\tskip_install_trust
\tstorage file_system {root / 'data'}
\tdefault_sni 127.0.0.1
}}
"""
    path = root / "Caddyfile"
    path.write_text(globals_ + main + "\n" + status)
    return path


def run_caddy(tmp_path, tls, collector, read_token) -> Iterator[Proxy]:
    caddy = _binary("caddy")
    if caddy is None:
        pytest.skip("needs caddy (Debian package caddy; .ci/run installs it)")
    ports = _free_ports("https", "status")
    config = caddy_config(tmp_path, tls, collector.url.removeprefix("http://"), read_token, ports)
    env = {**os.environ, "HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path / "xdg-data"),
           "XDG_CONFIG_HOME": str(tmp_path / "xdg-config")}
    checked = subprocess.run([caddy, "validate", "--config", str(config), "--adapter", "caddyfile"],
                             capture_output=True, text=True, env=env)
    assert checked.returncode == 0, checked.stderr
    assert "Valid configuration" in checked.stdout + checked.stderr
    log = tmp_path / "caddy.log"
    with log.open("w") as out:
        proc = subprocess.Popen([caddy, "run", "--config", str(config), "--adapter", "caddyfile"],
                                stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        proxy = Proxy("caddy", f"https://127.0.0.1:{ports['https']}", f"http://127.0.0.1:{ports['status']}",
                      str(tls / "fullchain.pem"), collector, read_token)
        _wait_until_serving(proc, proxy.https + "/api/health", proxy.cafile, log)
        yield proxy
    finally:
        _stop(proc)


def _behind(run, serve, tmp_path, tls) -> Iterator[Proxy]:
    read_token = "r-" + uuid.uuid4().hex
    collector = serve(write_token="w-" + uuid.uuid4().hex, read_token=read_token, **FAST)
    yield from run(tmp_path, tls, collector, read_token)


@pytest.fixture(params=["nginx", "caddy"])
def proxy(request, serve, tmp_path, tls) -> Iterator[Proxy]:
    """A live collector with both tokens behind the shipped nginx, then Caddy, configuration."""
    yield from _behind(run_nginx if request.param == "nginx" else run_caddy, serve, tmp_path, tls)


@pytest.fixture
def nginx_proxy(serve, tmp_path, tls) -> Iterator[Proxy]:
    """The same, nginx only."""
    yield from _behind(run_nginx, serve, tmp_path, tls)


# ---------------------------------------------------------------- the proofs


def test_status_proxy_reads_without_a_token(proxy):
    assert proxy.collector.put("/api/jobs/px-1", json=BODY).status_code == 200
    direct = proxy.collector.get("/api/jobs", token=proxy.read_token)
    through = proxy.get(proxy.status + "/status/api/jobs")
    assert through.status_code == 200
    assert through.json() == direct.json()
    assert [job["job_id"] for job in through.json()["jobs"]] == ["px-1"]
    # The query string survives the prefix rewrite.
    one = proxy.get(proxy.status + "/status/api/events", params={"after": 0, "limit": 1})
    assert one.status_code == 200 and len(one.json()["events"]) == 1


def test_status_proxy_replaces_the_client_authorization_header(proxy):
    response = proxy.get(proxy.status + "/status/api/jobs", headers={"Authorization": "Bearer wrong"})
    assert response.status_code == 200
    # Even the write token is replaced: nothing written through the proxy.
    put = requests.put(proxy.status + "/status/api/jobs/px-2", json=BODY, timeout=10,
                       headers={"Authorization": f"Bearer {proxy.collector.token}"})
    assert put.status_code == 403
    assert put.json()["detail"] == "the read token cannot write; use the write token"
    assert proxy.collector.get("/api/jobs/px-2").status_code == 404


def test_status_proxy_serves_the_page(proxy):
    page = proxy.get(proxy.status + "/status/")
    assert page.status_code == 200
    assert page.content == PAGE
    assert page.headers["Content-Type"].startswith("text/html")
    bare = proxy.get(proxy.status + "/status")
    assert bare.status_code in (301, 302, 308) and bare.headers["Location"].endswith("/status/")


@pytest.mark.parametrize("front", ["https", "status"])
def test_stream_through_the_proxy_delivers_an_event_within_a_second(proxy, front):
    if front == "https":
        stream = proxy.stream(proxy.https, "/api/events/stream", token=proxy.read_token)
    else:
        stream = proxy.stream(proxy.status, "/status/api/events/stream")
    try:
        assert stream.status == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        assert "content-encoding" not in stream.headers
        # Heartbeats every 0.3 s arrive as they are sent: nothing waits in a buffer.
        assert [f.event for f in stream.quiet_for(0.8)].count("heartbeat") >= 1
        assert stream.comments[0] == "collector event stream"
        sent = time.monotonic()
        assert proxy.collector.put("/api/jobs/px-3", json=BODY).status_code == 200
        [frame] = stream.events(1, timeout=1.0)
        assert time.monotonic() - sent < 1.0
        assert (frame.event, frame.json()["job_id"], frame.json()["status"]) == ("job-event", "px-3", "workers")
    finally:
        stream.close()


def test_body_limit_through_the_tls_front(proxy):
    headers = {"Authorization": f"Bearer {proxy.collector.token}", "Content-Type": "application/octet-stream"}

    def upload(size: int, offset: int = 0) -> requests.Response:
        params: dict[str, str | int] = {"file": "a.out", "offset": offset}
        return requests.post(proxy.https + "/api/jobs/px-4/logs", params=params, data=b"x" * size, headers=headers,
                             verify=proxy.cafile, timeout=30)

    assert proxy.collector.put("/api/jobs/px-4", json=BODY).status_code == 200
    # A full 1 MiB chunk (what the srtctl streamer sends at most) passes the proxy.
    full = upload(MIB)
    assert full.status_code == 200, full.text
    assert full.json()["stored"] == 1
    # One byte more is the collector's own 413, with its JSON envelope.
    over = upload(MIB + 1, offset=MIB)
    assert over.status_code == 413
    assert over.json()["detail"] == f"body of {MIB + 1} bytes exceeds the {MIB}-byte limit"
    # Far more is turned away by the proxy itself, from Content-Length, before the collector sees it.
    far = upload(2 * MIB, offset=MIB)
    assert far.status_code == 413
    assert "request_id" not in far.text


def test_the_longest_file_name_passes_the_proxy(proxy):
    # 4,096 characters (the API's limit), percent-encoded to more than nginx's default 8k line buffer.
    name = ("%%%%/" * 820)[:4092] + ".out"
    params: dict[str, str | int] = {"file": name, "offset": 0}
    response = requests.post(proxy.https + "/api/jobs/px-5/logs", params=params,
                             data=b"long\n", headers={"Authorization": f"Bearer {proxy.collector.token}"},
                             verify=proxy.cafile, timeout=30)
    assert len(response.request.url or "") > 8192
    assert (response.status_code, response.json()["stored"]) == (200, 1), response.text


def test_tls_front_passes_auth_through(proxy):
    assert proxy.get(proxy.https + "/api/jobs").status_code == 401
    ok = proxy.get(proxy.https + "/api/jobs", headers={"Authorization": f"Bearer {proxy.read_token}"})
    assert ok.status_code == 200
    assert ok.json()["jobs"] == []


def test_nginx_redirects_plain_http_to_https(nginx_proxy):
    # (The test's Caddy binds no :80 listener, so its automatic redirect is not run here.)
    response = requests.get(nginx_proxy.redirect + "/api/jobs?limit=1", allow_redirects=False, timeout=10)
    assert response.status_code == 301
    assert response.headers["Location"] == "https://127.0.0.1/api/jobs?limit=1"
