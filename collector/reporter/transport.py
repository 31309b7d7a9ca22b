"""HTTP transport with the srtctl reporter's rules: bounded, never raising, every endpoint gets everything.

5 s timeout, two attempts on network errors only (never on an HTTP status), redirects
never followed (a 3xx means a login page or proxy sits in front: a failure, logged at
WARNING like 401 and 403), other failures at DEBUG because reporting is fire-and-forget.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterable
from collections.abc import Mapping
from typing import Any

import requests

log = logging.getLogger("collector.reporter")

DEFAULT_TOKEN_ENV = "SRTCTL_STATUS_TOKEN"
ENDPOINTS_ENV = "COLLECTOR_ENDPOINTS"
WARN_STATUSES = (401, 403)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one endpoint answered to one request (status None: no answer at all)."""

    endpoint: str
    status: int | None
    body: dict[str, Any] | None
    ok: bool
    error: str | None

    @property
    def endpoint_failed(self) -> bool:
        """True when the endpoint itself is unusable (no answer, a redirect, 401, 403), not just this request."""
        return self.status is None or 300 <= self.status < 400 or self.status in WARN_STATUSES


def env_token(token_env: str | None = None) -> str | None:
    """The bearer token from the variable named ``token_env`` (default SRTCTL_STATUS_TOKEN).

    None when unset or empty.
    """
    return os.environ.get(token_env or DEFAULT_TOKEN_ENV) or None


def env_endpoints(given: Iterable[str] = ()) -> list[str]:
    """The endpoints given, else the comma-separated COLLECTOR_ENDPOINTS; blanks dropped."""
    endpoints = [e.strip() for e in given if e and e.strip()]
    if not endpoints:
        endpoints = [e.strip() for e in os.environ.get(ENDPOINTS_ENV, "").split(",") if e.strip()]
    return endpoints


class Transport:
    """Sends each request to every endpoint in turn; one ``requests.Session`` per endpoint when ``session``."""

    def __init__(self, endpoints: list[str], token: str | None, *, timeout: float = 5.0, attempts: int = 2,
                 session: bool = True) -> None:
        self.endpoints = [e.rstrip("/") for e in endpoints]
        self.token = token or None
        self.timeout = timeout
        self.attempts = max(1, attempts)
        # Persistent connections for the streamer; srtctl's status reporter opens one per request.
        self._sessions = {e: requests.Session() for e in self.endpoints} if session else {}

    def send(self, method: str, path: str, *, json: Any = None, params: Mapping[str, object] | None = None,
             data: bytes | None = None, headers: Mapping[str, str] | None = None, ok: tuple[int, ...] = (200,),
             timeout: float | None = None) -> list[Outcome]:
        """Send one request to every endpoint; one Outcome per endpoint, in order."""
        return [self.send_to(endpoint, method, path, json=json, params=params, data=data, headers=headers, ok=ok,
                             timeout=timeout) for endpoint in self.endpoints]

    def send_to(self, endpoint: str, method: str, path: str, *, json: Any = None,
                params: Mapping[str, object] | None = None, data: bytes | None = None,
                headers: Mapping[str, str] | None = None, ok: tuple[int, ...] = (200,),
                timeout: float | None = None) -> Outcome:
        """Send one request to one endpoint (at most ``attempts`` tries of ``timeout`` seconds); never raises.

        ``timeout`` (seconds) lowers the transport's for this request, e.g. to fit a shutdown deadline.
        """
        endpoint = endpoint.rstrip("/")
        request_headers = dict(headers or {})
        if self.token:
            request_headers["Authorization"] = f"Bearer {self.token}"
        if data is not None:
            request_headers.setdefault("Content-Type", "application/octet-stream")
        url = endpoint + path
        error = None
        for attempt in range(1, self.attempts + 1):
            try:
                response = self._request(endpoint, method, url, json=json, params=params, data=data,
                                         headers=request_headers, timeout=self._timeout(timeout))
            except (requests.ConnectionError, requests.Timeout) as exc:
                error = f"{type(exc).__name__}: {exc}"
                log.debug("%s %s: attempt %d of %d failed: %s", method, url, attempt, self.attempts, error)
                continue
            except Exception as exc:  # noqa: BLE001 - a bad URL or anything else must not reach the job
                error = f"{type(exc).__name__}: {exc}"
                log.debug("%s %s failed: %s", method, url, error)
                return Outcome(endpoint, None, None, False, error)
            return _judge(endpoint, method, url, response, ok)
        return Outcome(endpoint, None, None, False, error)

    def close(self) -> None:
        """Close the persistent connections."""
        for session in self._sessions.values():
            session.close()

    def _timeout(self, lower: float | None) -> float:
        # Never 0: requests would turn that into a non-blocking socket that fails at once.
        return self.timeout if lower is None else max(0.01, min(self.timeout, lower))

    def _request(self, endpoint: str, method: str, url: str, **kwargs: Any) -> requests.Response:
        session = self._sessions.get(endpoint)
        send = session.request if session is not None else requests.request
        return send(method, url, allow_redirects=False, **kwargs)


def _judge(endpoint: str, method: str, url: str, response: requests.Response, ok: tuple[int, ...]) -> Outcome:
    status = response.status_code
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        body = None
    if status in ok:
        return Outcome(endpoint, status, body, True, None)
    error = f"HTTP {status}"
    if 300 <= status < 400:
        error += f" redirect to {response.headers.get('Location', '?')} (not followed)"
        log.warning("%s %s: %s: is the endpoint behind a login page or proxy?", method, url, error)
    elif status in WARN_STATUSES:
        log.warning("%s %s: %s: check the token (SRTCTL_STATUS_TOKEN or --token-env)", method, url, error)
    else:
        detail = (body or {}).get("detail") if body else response.text[:200]
        log.debug("%s %s: %s %s", method, url, error, detail)
    return Outcome(endpoint, status, body, False, error)
