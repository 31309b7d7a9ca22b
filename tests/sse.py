"""A server-sent events client on a raw socket: frames read against deadlines, a disconnect on demand.

A socket rather than a client library, so a test sees exactly what the server sent (the
bytes, a clean end of the chunked body versus a cut one) and can drop the connection
the way a crashed client would.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from collections import deque
from typing import NamedTuple
from urllib.parse import urlencode
from urllib.parse import urlsplit


class Frame(NamedTuple):
    """One dispatched event: its ``id:`` field (None when the frame had none), type and data."""

    id: str | None
    event: str
    data: str

    def json(self):
        return json.loads(self.data)


class Stream:
    """One GET on its own connection; for a 200, its body parsed as an event stream as it arrives."""

    def __init__(self, sock: socket.socket, timeout: float) -> None:
        self.sock = sock
        self.frames: deque[Frame] = deque()  # parsed, not yet taken by next()
        self.comments: list[str] = []
        self.retry: int | None = None
        self.last_id: str | None = None  # what an EventSource would send as Last-Event-ID
        self.text = ""  # the decoded body so far, for exact checks
        self.complete = False  # the server ended the body properly (last chunk, or its length)
        self.eof = False  # the connection closed, properly or not
        self._raw = b""  # bytes received and not yet decoded
        self._body = b""  # body bytes not yet parsed as event-stream text
        deadline = time.monotonic() + timeout
        while b"\r\n\r\n" not in self._raw:
            if self.eof:
                raise ConnectionError(f"connection closed before the response head: {self._raw!r}")
            self._fill(deadline)
        head, self._raw = self._raw.split(b"\r\n\r\n", 1)
        status_line, *lines = head.decode("latin-1").split("\r\n")
        self.status = int(status_line.split()[1])
        self.headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            self.headers[name.strip().lower()] = value.strip()
        self.chunked = "chunked" in self.headers.get("transfer-encoding", "").lower()
        self.length = int(self.headers["content-length"]) if "content-length" in self.headers else None
        self._decode()

    # -- reading -----------------------------------------------------------------

    def _fill(self, deadline: float) -> None:
        # Past the deadline the read does not block but still takes what has already arrived.
        self.sock.settimeout(max(deadline - time.monotonic(), 0.0))
        try:
            data = self.sock.recv(65536)
        except (TimeoutError, BlockingIOError):
            raise TimeoutError("nothing more arrived before the deadline") from None
        except ConnectionResetError:
            data = b""
        if data:
            self._raw += data
        else:
            self.eof = True

    def _decode(self) -> None:
        """Move whole chunks (or plain body bytes) from the socket buffer into the body."""
        if not self.chunked:
            self._body += self._raw
            self._raw = b""
            self.complete = self.length is not None and len(self._body) >= self.length or (
                self.length is None and self.eof)
        else:
            while not self.complete and b"\r\n" in self._raw:
                size_line, rest = self._raw.split(b"\r\n", 1)
                size = int(size_line.split(b";")[0], 16)
                if len(rest) < size + 2:
                    break  # the rest of this chunk is still on its way
                self._body += rest[:size]
                self._raw = rest[size + 2:]
                self.complete = size == 0
        if self.status == 200 and self.headers.get("content-type", "").startswith("text/event-stream"):
            self._parse()

    def _parse(self) -> None:
        while b"\n\n" in self._body:
            block, self._body = self._body.split(b"\n\n", 1)
            text = block.decode("utf-8")
            self.text += text + "\n\n"
            ident, kind, data = None, "message", []
            for line in text.split("\n"):
                if line.startswith(":"):
                    self.comments.append(line[1:].removeprefix(" "))
                    continue
                field, _, value = line.partition(":")
                value = value.removeprefix(" ")
                if field == "id":
                    ident = self.last_id = value
                elif field == "event":
                    kind = value
                elif field == "data":
                    data.append(value)
                elif field == "retry":
                    self.retry = int(value)
            if data:
                self.frames.append(Frame(ident, kind, "\n".join(data)))

    @property
    def ended(self) -> bool:
        """Nothing more will come: the body ended or the connection closed."""
        return self.complete or self.eof

    def next(self, timeout: float = 10) -> Frame:
        """The next frame; TimeoutError if none arrives in ``timeout`` s, EOFError once the stream ended."""
        deadline = time.monotonic() + timeout
        while not self.frames:
            if self.ended:
                raise EOFError("the stream ended")
            self._fill(deadline)
            self._decode()
        return self.frames.popleft()

    def events(self, count: int, timeout: float = 10) -> list[Frame]:
        """The next ``count`` job-event frames, skipping heartbeats, all within ``timeout`` s."""
        deadline = time.monotonic() + timeout
        got: list[Frame] = []
        while len(got) < count:
            try:
                frame = self.next(deadline - time.monotonic())
            except (TimeoutError, EOFError) as exc:
                raise AssertionError(f"{type(exc).__name__} after {len(got)} of {count} events: "
                                     f"{[f.id for f in got]}") from None
            if frame.event != "heartbeat":
                got.append(frame)
        return got

    def quiet_for(self, seconds: float) -> list[Frame]:
        """Every frame that arrives in the next ``seconds`` s (the stream may end meanwhile)."""
        deadline = time.monotonic() + seconds
        got = []
        while True:
            try:
                got.append(self.next(deadline - time.monotonic()))
            except (TimeoutError, EOFError):
                return got

    def until_end(self, timeout: float = 10) -> list[Frame]:
        """Every frame until the server ends the response; AssertionError if it is still open at ``timeout``."""
        deadline = time.monotonic() + timeout
        got = []
        while True:
            try:
                got.append(self.next(deadline - time.monotonic()))
            except EOFError:
                return got
            except TimeoutError:
                raise AssertionError(f"the stream was still open after {timeout} s") from None

    def body(self, timeout: float = 10) -> bytes:
        """The whole body of a response that is not an event stream (an error, say)."""
        deadline = time.monotonic() + timeout
        while not self.ended:
            self._fill(deadline)
            self._decode()
        return self._body

    def json(self):
        return json.loads(self.body())

    # -- ending ------------------------------------------------------------------

    def disconnect(self) -> None:
        """Drop the connection with a reset, as a killed client would: the server's next write fails."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close()

    def close(self) -> None:
        self.sock.close()


def connect(url: str, path: str, *, token: str | None = None, params: dict | None = None,
            headers: dict[str, str] | None = None, timeout: float = 10) -> Stream:
    """``GET path`` on a fresh connection to ``url``, returned once the response head is in."""
    parts = urlsplit(url)
    target = path + ("?" + urlencode(params) if params else "")
    lines = [f"GET {target} HTTP/1.1", f"Host: {parts.netloc}", "Accept: text/event-stream"]
    if token:
        lines.append(f"Authorization: Bearer {token}")
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    sock = socket.create_connection((parts.hostname, parts.port), timeout=timeout)
    try:
        # latin-1: what HTTP puts on the wire for a header value, so odd bytes can be sent too.
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        return Stream(sock, timeout)
    except BaseException:
        sock.close()
        raise
