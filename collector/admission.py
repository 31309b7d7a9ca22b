"""At most ``request_threads`` ordinary requests run at once in a process; streams are not counted.

gunicorn gives every worker a thread per possible stream on top of the request threads
(deploy/gunicorn.conf.py). Without a cap, that many requests could run together, and in
one process they only fight over the GIL: keep-alive PUT throughput fell from 0.91 to
0.61 of the baseline with 508 threads against 8. Requests past the cap wait here, as
they would for a free thread in a pool of that size.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from collections.abc import Iterable

from werkzeug.wsgi import ClosingIterator

STREAM_SUFFIX = "/stream"


class Admission:
    """WSGI middleware: hold a slot from the call until the server closes the response."""

    def __init__(self, app: Callable, limit: int) -> None:
        self.app = app
        # Settings.check() refuses a limit under 1 before serving; building the app must not fail first.
        self._slots = threading.BoundedSemaphore(max(limit, 1))

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        # A stream holds its thread for minutes and has its own cap (max_streams).
        if environ.get("PATH_INFO", "").endswith(STREAM_SUFFIX):
            return self.app(environ, start_response)
        self._slots.acquire()
        try:
            body = self.app(environ, start_response)
        except BaseException:
            self._slots.release()
            raise
        return ClosingIterator(body, self._slots.release)
