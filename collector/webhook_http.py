"""POSTs to webhook receivers on kept-alive connections, with the standard library's http.client.

A delivery is one small POST and a status line back, about 212 a second in the bench, in
the same processes that serve the API. urllib3 spent 210 µs of CPU on each (pools, retries
and timeouts objects, header dicts); http.client on a kept-alive connection spends about 80
(docs/performance.md, "Webhooks"). Everything a delivery needs is here: keep-alive per
receiver, connect and read timeouts, no redirects (http.client never follows one), HTTP
proxies from the environment read once, and a receiver's refusal read only as far as its
first ``ERROR_BYTES``.
"""

from __future__ import annotations

import base64
import collections
import http.client
import threading
import urllib.parse
import urllib.request
from dataclasses import dataclass
from dataclasses import field

CONNECT_TIMEOUT_S = 5.0
# No answer, or a pause in one, this long is a failed attempt.
READ_TIMEOUT_S = 10.0
ERROR_BYTES = 500
IDLE_PER_RECEIVER = 8  # kept-alive connections per receiver (the senders of one process)
RECEIVERS_KEPT = 64  # receivers whose idle connections are kept, the most recently used
ROUTES_KEPT = 4096  # URLs whose route is remembered (all of them, but for a deployment gone wild)
# A kept-alive connection the receiver closed while it sat idle fails like this, before any
# answer: the POST goes again at once on a new connection (the receiver never saw it, or
# it closed without answering, which at-least-once allows to resend).
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


@dataclass(frozen=True)
class _Route:
    """Where to connect for a URL and what to ask there: the receiver itself, or a proxy.

    Equal for every URL served over the same connections (the target aside).
    """

    scheme: str
    host: str
    port: int
    target: str = field(compare=False)  # the request target: the path, or the whole URL through an HTTP proxy
    tunnel: tuple[str, int] | None = None  # HTTPS through a proxy: CONNECT to this
    proxy_headers: tuple[tuple[str, str], ...] = ()  # with each request, or with the CONNECT of a tunnel


class Receivers:
    """Kept-alive connections to webhook receivers, shared by one process's sender threads."""

    def __init__(self, proxies: dict[str, str] | None = None) -> None:
        # Read once, as every setting: the receivers a proxy must reach, the way requests does.
        self.proxies = urllib.request.getproxies_environment() if proxies is None else proxies
        # A URL's route, found once: a deployment has as many URLs as subscriptions.
        self._routes: dict[str, _Route] = {}
        self._idle: collections.OrderedDict[_Route, list[http.client.HTTPConnection]] = collections.OrderedDict()
        self._lock = threading.Lock()

    def post(self, url: str, body: bytes, headers: dict[str, str]) -> tuple[int | None, str | None]:
        """POST ``body`` to ``url``: the receiver's status (None: no answer) and, unless 2xx, why it failed."""
        try:
            route = self._routes.get(url) or self._route(url)
        except ValueError as exc:
            return None, f"{type(exc).__name__}: {exc}"
        conn, reused = self._take(route)
        try:
            try:
                response = self._exchange(conn, route, body, headers)
            except _STALE:
                if not reused:
                    raise
                conn.close()
                conn = self._connect(route)
                response = self._exchange(conn, route, body, headers)
            # The start of a refusal says why; a receiver's whole page is never read.
            start = response.read(ERROR_BYTES)
            reusable = not response.will_close and not response.read(1)
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            return None, f"{type(exc).__name__}: {exc}"
        if reusable:
            self._give_back(route, conn)  # kept alive for the receiver's next delivery
        else:
            conn.close()
        status = response.status
        return status, None if 200 <= status < 300 else start.decode(errors="replace")

    def close(self) -> None:
        """Close every idle connection."""
        with self._lock:
            idle, self._idle = self._idle, collections.OrderedDict()
        for conns in idle.values():
            for conn in conns:
                conn.close()

    def _exchange(self, conn: http.client.HTTPConnection, route: _Route, body: bytes,
                  headers: dict[str, str]) -> http.client.HTTPResponse:
        if conn.sock is None:
            conn.connect()
            _wait_for_answers(conn)
        if route.proxy_headers and route.tunnel is None:
            headers = {**headers, **dict(route.proxy_headers)}
        conn.request("POST", route.target, body=body, headers=headers)
        return conn.getresponse()

    def _take(self, route: _Route) -> tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            conns = self._idle.get(route)
            if conns:
                self._idle.move_to_end(route)
                return conns.pop(), True
        return self._connect(route), False

    def _connect(self, route: _Route) -> http.client.HTTPConnection:
        kind = http.client.HTTPSConnection if route.scheme == "https" else http.client.HTTPConnection
        conn = kind(route.host, route.port, timeout=CONNECT_TIMEOUT_S)
        if route.tunnel is not None:
            conn.set_tunnel(*route.tunnel, headers=dict(route.proxy_headers))
        return conn

    def _give_back(self, route: _Route, conn: http.client.HTTPConnection) -> None:
        surplus: list[http.client.HTTPConnection] = []
        with self._lock:
            conns = self._idle.setdefault(route, [])
            self._idle.move_to_end(route)
            if len(conns) < IDLE_PER_RECEIVER:
                conns.append(conn)
            else:
                surplus.append(conn)
            while len(self._idle) > RECEIVERS_KEPT:
                surplus += self._idle.popitem(last=False)[1]
        for extra in surplus:
            extra.close()

    def _route(self, url: str) -> _Route:
        if len(self._routes) >= ROUTES_KEPT:
            self._routes.clear()
        route = self._routes[url] = self._find_route(url)
        return route

    def _find_route(self, url: str) -> _Route:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL with a host: {url!r}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        target = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
        bypass = urllib.request.proxy_bypass_environment  # type: ignore[attr-defined]  # not in typeshed
        proxy = None if bypass(parts.hostname, self.proxies) else self.proxies.get(parts.scheme)
        if not proxy:
            return _Route(parts.scheme, parts.hostname, port, target)
        via = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        if not via.hostname:
            raise ValueError(f"the {parts.scheme} proxy is not a URL with a host: {proxy!r}")
        auth: tuple[tuple[str, str], ...] = ()
        if via.username is not None:
            credentials = f"{urllib.parse.unquote(via.username)}:{urllib.parse.unquote(via.password or '')}"
            auth = (("Proxy-Authorization", "Basic " + base64.b64encode(credentials.encode()).decode()),)
        proxy_port = via.port or (443 if via.scheme == "https" else 80)
        if parts.scheme == "https":
            # Through the proxy by CONNECT: TLS is end to end, the target is the path.
            return _Route("https", via.hostname, proxy_port, target, tunnel=(parts.hostname, port),
                          proxy_headers=auth)
        whole = urllib.parse.urlunsplit(parts._replace(fragment=""))
        return _Route(via.scheme, via.hostname, proxy_port, whole, proxy_headers=auth)


def _wait_for_answers(conn: http.client.HTTPConnection) -> None:
    # The connect timeout was the constructor's; answers get longer.
    conn.sock.settimeout(READ_TIMEOUT_S)
