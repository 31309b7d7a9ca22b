"""The webhook sender's HTTP (collector/webhook_http.py) against real receivers and proxies on loopback."""

from __future__ import annotations

import base64
import http.server
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from collector import webhook_http
from collector.webhook_http import Receivers
from tests.helpers import DROP
from tests.helpers import HANG
from tests.helpers import Recorder

NO_CONTENT: tuple[int, dict[str, str], bytes] = (204, {}, b"")


@pytest.fixture
def receivers() -> Iterator[Receivers]:
    """A sender's connections, with no proxy whatever this machine's environment says."""
    sender = Receivers(proxies={})
    yield sender
    sender.close()


def script(*answers):
    """These answers in turn, then 204 for good."""
    queue = list(answers)
    return lambda request, recorder: queue.pop(0) if queue else NO_CONTENT


def test_deliveries_to_one_receiver_share_a_kept_alive_connection(receivers):
    receiver = Recorder(script=script())
    try:
        results = [receivers.post(f"{receiver.url}/hook/{n}?team=a", b'{"n":%d}' % n,
                                  {"Content-Type": "application/json", "X-Collector-Delivery": str(n)})
                   for n in range(3)]
    finally:
        receiver.close()
    assert results == [(204, None)] * 3
    assert receiver.connections == 1
    assert [(r.method, r.path, r.params, r.body, r.headers["X-Collector-Delivery"]) for r in receiver.requests] == [
        ("POST", f"/hook/{n}", {"team": "a"}, b'{"n":%d}' % n, str(n)) for n in range(3)]



def test_routes_are_remembered_per_url_up_to_a_bound_and_still_found_past_it(receivers, monkeypatch):
    # A URL's route (proxy or not, the request target) is found once; past ROUTES_KEPT URLs
    # the memory starts over rather than grow, and every POST still reaches its receiver.
    monkeypatch.setattr(webhook_http, "ROUTES_KEPT", 2)
    receiver = Recorder(script=script())
    try:
        urls = [f"{receiver.url}/hook/{n}" for n in range(3)]
        results = [receivers.post(url, b"{}", {"Content-Type": "application/json"}) for url in urls + urls[:1]]
    finally:
        receiver.close()
    assert results == [(204, None)] * 4
    assert [r.path for r in receiver.requests] == ["/hook/0", "/hook/1", "/hook/2", "/hook/0"]
    # Two remembered, then cleared for the third, then the first found again.
    assert sorted(receivers._routes) == [urls[0], urls[2]]


def test_idle_connections_are_kept_for_the_receivers_used_last_and_no_more_per_receiver(receivers, monkeypatch):
    monkeypatch.setattr(webhook_http, "RECEIVERS_KEPT", 2)
    monkeypatch.setattr(webhook_http, "IDLE_PER_RECEIVER", 1)
    first, second = Recorder(script=script()), Recorder(script=script())

    def slowly(request, recorder):
        time.sleep(0.3)  # long enough for two POSTs to be at it together
        return NO_CONTENT

    third = Recorder(script=slowly)

    def two_at_once() -> None:
        both = [threading.Thread(target=receivers.post, args=(third.url + "/hook", b"{}", {})) for _ in range(2)]
        for thread in both:
            thread.start()
        for thread in both:
            thread.join(10)

    try:
        for receiver in (first, second, first, third, second, first):
            assert receivers.post(receiver.url + "/hook", b"{}", {}) == (204, None)
        # Two POSTs at once to one receiver need two connections, of which one is kept: the
        # next two reuse it and open one more.
        two_at_once()
        two_at_once()
    finally:
        for receiver in (first, second, third):
            receiver.close()
    # first's connection outlived second's use (two receivers kept), not third's and second's after it.
    assert [r.connection for r in first.requests] == [1, 1, 2]
    assert [r.connection for r in second.requests] == [1, 2]
    assert (len(third.requests), third.connections) == (5, 4)

def test_a_refusal_says_why_in_its_first_500_bytes_and_a_long_page_is_not_read(receivers):
    page = b"x" * 200_000
    receiver = Recorder(script=script((503, {"Content-Type": "text/plain"}, b"busy: try later"),
                                      (500, {"Content-Type": "text/html"}, page)))
    try:
        busy = receivers.post(receiver.url + "/hook", b"{}", {})
        failed = receivers.post(receiver.url + "/hook", b"{}", {})
        after = receivers.post(receiver.url + "/hook", b"{}", {})
    finally:
        receiver.close()
    assert busy == (503, "busy: try later")
    assert failed == (500, "x" * webhook_http.ERROR_BYTES)
    assert after == (204, None)
    # The short refusal was read whole and its connection kept; the long page's was closed.
    assert [r.connection for r in receiver.requests] == [1, 1, 2]


def test_a_connection_the_receiver_closed_while_idle_is_replaced_without_a_failed_try(receivers):
    # A receiver that answers as if keeping the connection alive, then closes it once idle.
    listener = socket.create_server(("127.0.0.1", 0))
    requests: list[tuple[int, bytes]] = []

    def serve() -> None:
        for number in (1, 2):
            conn, _ = listener.accept()
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                while len(body) < length:
                    body += conn.recv(65536)
                requests.append((number, body))
                conn.sendall(b"HTTP/1.1 204 No Content\r\n\r\n")
                time.sleep(0.1)  # then closes: its idle timeout

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/hook"
    try:
        first = receivers.post(url, b"first", {})
        time.sleep(0.5)  # the receiver has closed the kept connection by now
        second = receivers.post(url, b"second", {})
        server.join(5)
    finally:
        listener.close()
    assert (first, second) == ((204, None), (204, None))
    assert requests == [(1, b"first"), (2, b"second")]


def test_a_receiver_that_closes_without_answering_twice_is_a_failed_try(receivers):
    receiver = Recorder(script=script(NO_CONTENT, DROP, DROP))
    try:
        assert receivers.post(receiver.url + "/hook", b"{}", {}) == (204, None)
        status, error = receivers.post(receiver.url + "/hook", b"{}", {})
    finally:
        receiver.close()
    # The kept connection failed, so once more on a new one (at least once allows it), and no more.
    assert status is None and error == "RemoteDisconnected: Remote end closed connection without response"
    assert [r.connection for r in receiver.requests] == [1, 1, 2]


def test_no_answer_within_the_read_timeout_is_a_failed_try(receivers, monkeypatch):
    monkeypatch.setattr(webhook_http, "READ_TIMEOUT_S", 0.3)
    receiver = Recorder(script=script(HANG))
    try:
        started = time.monotonic()
        status, error = receivers.post(receiver.url + "/hook", b"{}", {})
        took = time.monotonic() - started
        after = receivers.post(receiver.url + "/hook", b"{}", {})
    finally:
        receiver.close()
    assert (status, error) == (None, "TimeoutError: timed out")
    assert 0.3 <= took < 3
    assert after == (204, None)


def test_an_unreachable_receiver_or_a_bad_url_is_a_failed_try_that_says_why(receivers):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
    status, error = receivers.post(f"http://127.0.0.1:{port}/hook", b"{}", {})
    assert status is None and error.startswith("ConnectionRefusedError: ")
    assert receivers.post("ftp://example.com/x", b"{}", {}) == (
        None, "ValueError: not an http(s) URL with a host: 'ftp://example.com/x'")


def test_through_an_http_proxy_the_receiver_is_named_and_no_proxy_goes_direct():
    proxy = Recorder(script=script())
    direct = Recorder(script=script())
    sender = Receivers(proxies={"http": proxy.url.replace("http://", "http://ops:s%40cret@"),
                                "no": "127.0.0.1"})
    try:
        via = sender.post("http://hooks.example:8080/hook?team=a#part", b"{}", {"X-Collector-Event": "failed"})
        straight = sender.post(direct.url + "/hook", b"{}", {})
    finally:
        sender.close()
        proxy.close()
        direct.close()
    assert (via, straight) == ((204, None), (204, None))
    (request,) = proxy.requests
    assert (request.path, request.params, request.headers["Host"], request.headers["X-Collector-Event"]) == (
        "/hook", {"team": "a"}, "hooks.example:8080", "failed")
    assert request.headers["Proxy-Authorization"] == "Basic " + base64.b64encode(b"ops:s@cret").decode()
    assert [r.headers.get("Proxy-Authorization") for r in direct.requests] == [None]


def test_https_through_a_proxy_asks_it_for_a_tunnel_and_keeps_the_credentials_off_the_receiver():
    asked: list[tuple[str, str | None]] = []

    class Proxy(http.server.BaseHTTPRequestHandler):
        def do_CONNECT(self) -> None:  # noqa: N802 - http.server's naming
            asked.append((self.path, self.headers.get("Proxy-Authorization")))
            self.send_error(407, "Proxy Authentication Required")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sender = Receivers(proxies={"https": f"http://ops:pw@127.0.0.1:{server.server_port}"})
    try:
        status, error = sender.post("https://hooks.example/hook", b"{}", {})
    finally:
        sender.close()
        server.shutdown()
        server.server_close()
    assert status is None and error == "OSError: Tunnel connection failed: 407 Proxy Authentication Required"
    assert asked == [("hooks.example:443", "Basic " + base64.b64encode(b"ops:pw").decode())]
