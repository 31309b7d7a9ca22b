"""A collector's read API over HTTP, with errors a person can act on.

Standard library only (urllib), so the readers load fast. Redirects are refused, not
followed: a token must never be sent on to another host, and the error says where the
collector pointed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from collections.abc import Mapping
from typing import Any

ENDPOINT_ENV = "COLLECTOR_ENDPOINT"
DEFAULT_ENDPOINT = "http://127.0.0.1:8080"  # `collector serve`'s own default
# A read token, or the write token when only that is set (it can read too).
TOKEN_ENVS = ("SRTCTL_STATUS_READ_TOKEN", "SRTCTL_STATUS_TOKEN")
TIMEOUT_S = 30.0
STREAM_TIMEOUT_S = 90.0  # several heartbeats (30 s apart by default) without a byte: the stream is dead


class ReaderError(Exception):
    """Something a person must fix or know about (the message says which); never a traceback."""


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]
        return None  # urllib then raises HTTPError with the 3xx, which _error explains


_OPENER = urllib.request.build_opener(_NoRedirects)


def job_path(job_id: str, rest: str = "") -> str:
    """``/api/jobs/<job_id><rest>``, the id quoted whole (a Slurm array id may hold ``/`` or ``%``)."""
    return f"/api/jobs/{urllib.parse.quote(job_id, safe='')}{rest}"


def token_from_env(env: Mapping[str, str] = os.environ) -> str | None:
    """The token the readers send: the read token, else the write token, else none."""
    return next((env[name] for name in TOKEN_ENVS if env.get(name)), None)


def endpoint_from_env(env: Mapping[str, str] = os.environ) -> str:
    """Where the readers read from when ``--endpoint`` is not given."""
    return env.get(ENDPOINT_ENV) or DEFAULT_ENDPOINT


@dataclasses.dataclass(frozen=True)
class Frame:
    """One server-sent event: its id (None for a frame without one), type and data."""

    id: int | None
    event: str
    data: str


@dataclasses.dataclass
class Collector:
    """One collector's read API."""

    endpoint: str
    token: str | None = None
    timeout: float = TIMEOUT_S

    def __post_init__(self) -> None:
        parts = urllib.parse.urlsplit(self.endpoint)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ReaderError(f"--endpoint {self.endpoint!r} is not an http(s) URL (e.g. {DEFAULT_ENDPOINT})")
        self.endpoint = self.endpoint.rstrip("/")

    def url(self, path: str, params: dict[str, Any] | None = None) -> str:
        """The full URL of ``path`` with the query ``params`` that are not None."""
        query = urllib.parse.urlencode({k: v for k, v in (params or {}).items() if v is not None and v != ""})
        return f"{self.endpoint}{path}" + (f"?{query}" if query else "")

    def get(self, path: str, params: dict[str, Any] | None = None) -> Any:
        """GET ``path`` and return its JSON."""
        with self._open(self.url(path, params), {"Accept": "application/json"}, self.timeout) as response:
            body = response.read()
        try:
            return json.loads(body)
        except ValueError:
            raise ReaderError(f"{self.endpoint} answered {path} with something other than JSON "
                              f"({body[:80]!r}): is --endpoint the collector's base URL?") from None

    def stream(self, path: str, params: dict[str, Any] | None = None, *, last_event_id: int | None = None
               ) -> Iterator[Frame]:
        """The frames of a server-sent event stream until it ends (EOF or no byte for a while)."""
        headers = {"Accept": "text/event-stream"}
        if last_event_id is not None:
            headers["Last-Event-ID"] = str(last_event_id)
        with self._open(self.url(path, params), headers, STREAM_TIMEOUT_S) as response:
            fields: dict[str, str] = {}
            try:
                for raw in response:
                    line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                    if not line:
                        if "data" in fields:
                            yield Frame(int(fields["id"]) if fields.get("id", "").isdigit() else None,
                                        fields.get("event", "message"), fields["data"])
                        fields = {}
                    elif not line.startswith(":"):
                        name, _, value = line.partition(":")
                        value = value.removeprefix(" ")
                        fields[name] = fields[name] + "\n" + value if name == "data" and name in fields else value
            except (TimeoutError, OSError):
                return  # the stream went quiet or dropped: the caller resumes from the last id

    def _open(self, url: str, headers: dict[str, str], timeout: float) -> Any:
        request = urllib.request.Request(url, headers={**headers, "User-Agent": "collector-reader/1"})
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            return _OPENER.open(request, timeout=timeout)
        except urllib.error.HTTPError as exc:
            raise ReaderError(_error(self.endpoint, exc)) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ReaderError(f"cannot reach the collector at {self.endpoint}: {reason}") from None


def _error(endpoint: str, exc: urllib.error.HTTPError) -> str:
    """What an error answer means for the person who asked."""
    code = exc.code
    if 300 <= code < 400:
        where = exc.headers.get("Location", "somewhere else")
        return (f"the collector at {endpoint} redirected to {where} ({code}); readers do not follow redirects "
                f"(a token must not travel on): give that address as --endpoint")
    try:
        document = json.loads(exc.read() or b"{}")
    except ValueError:
        document = {}
    detail = document.get("detail") if isinstance(document, dict) else None
    detail = detail if isinstance(detail, str) else exc.reason
    if code == 401:
        return (f"the collector at {endpoint} wants a token (401: {detail}); set SRTCTL_STATUS_READ_TOKEN "
                f"(or SRTCTL_STATUS_TOKEN)")
    if code == 403:
        return f"the collector at {endpoint} refused this token (403: {detail})"
    if code == 409 and isinstance(document.get("clusters"), list):
        return f"{detail} (give --cluster {' or '.join(map(str, document['clusters']))})"
    return f"{detail} ({code})" if code in (404, 422) else f"the collector at {endpoint} answered {code}: {detail}"
