"""Raw HTTP on a socket, for what a well-behaved client library will not send."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit


def raw_exchange(api, head: bytes, body: bytes = b"", *, half_close: bool = False) -> str:
    """Send ``head`` (request line and headers, each ending CRLF) plus the bearer token, then ``body``.

    Reads the reply until the server closes the connection; ``half_close`` closes our
    write side first, as a client that gave up mid-body would.
    """
    parts = urlsplit(api.url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(head + b"Authorization: Bearer " + api.token.encode() + b"\r\n\r\n" + body)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    return reply.decode("utf-8", "replace")
