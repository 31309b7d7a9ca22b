"""At most ``request_threads`` ordinary requests run at once in a process; streams are not counted.

gunicorn gives every worker a thread per possible stream on top of the request threads
(collector/serving.py). Without a cap, that many requests could run together, and in
one process they only fight over the GIL: keep-alive PUT throughput fell from 0.91 to
0.61 of the baseline with 508 threads against 8. Requests past the cap wait here, as
they would for a free thread in a pool of that size, but never longer than the queue
timeout: a request that waited that long is answered 503 and never run, because its
client (the srtctl reporter waits 5 s) has given up, and running it late would only
delay the requests behind it.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse
    from _typeshed.wsgi import WSGIApplication
    from _typeshed.wsgi import WSGIEnvironment

from collector.guard import request_id_for

STREAM_SUFFIX = "/stream"
log = logging.getLogger("collector")


class _Held:
    """A response body holding a slot: the slot comes back when the server closes it, or once it is dropped.

    The server closes the response, but one that fails before it does (werkzeug's
    development server, when a client resets the connection) would leak the slot for
    good; when nothing refers to the body any more, ``__del__`` gives it back instead.
    Neither can run while the other does (``close`` holds a reference), so no lock.
    """

    __slots__ = ("_body", "_semaphore")

    def __init__(self, body: Iterable[bytes], semaphore: threading.BoundedSemaphore) -> None:
        self._body = body
        self._semaphore: threading.BoundedSemaphore | None = semaphore

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._body)

    def close(self) -> None:
        """Close the app's body, then give the slot back."""
        try:
            close = getattr(self._body, "close", None)
            if close is not None:
                close()
        finally:
            self._release()

    def _release(self) -> None:
        semaphore, self._semaphore = self._semaphore, None
        if semaphore is not None:
            semaphore.release()

    def __del__(self) -> None:
        self._release()


class Admission:
    """WSGI middleware: hold a slot from the call until the server closes the response."""

    def __init__(self, app: WSGIApplication, limit: int, queue_timeout_s: float = 5.0,
                 on_shed: Callable[[], None] | None = None) -> None:
        self.app = app
        # Settings.check() refuses a limit under 1 before serving; building the app must not fail first.
        self._slots = threading.BoundedSemaphore(max(limit, 1))
        self.queue_timeout_s = queue_timeout_s
        self._on_shed = on_shed

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        # A stream holds its thread for minutes and has its own cap (max_streams).
        if environ.get("PATH_INFO", "").endswith(STREAM_SUFFIX):
            return self.app(environ, start_response)
        if not self._slots.acquire(timeout=self.queue_timeout_s):
            return self._shed(environ, start_response)
        try:
            body = self.app(environ, start_response)
        except BaseException:
            self._slots.release()
            raise
        return _Held(body, self._slots)

    def _shed(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if self._on_shed is not None:
            self._on_shed()
        detail = (f"the server is busy: this request waited more than {self.queue_timeout_s:g} s for a free "
                  "request slot and was not run; try again")
        request_id = request_id_for(environ.get("HTTP_X_REQUEST_ID"))
        log.warning("shed %s %s after %g s in the queue [request_id=%s]", environ.get("REQUEST_METHOD"),
                    environ.get("PATH_INFO"), self.queue_timeout_s, request_id)
        body = json.dumps({"detail": detail, "request_id": request_id}).encode()
        start_response("503 Service Unavailable", [
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(body))),
            ("Retry-After", "1"),
            ("X-Request-ID", request_id),
        ])
        return [body]
