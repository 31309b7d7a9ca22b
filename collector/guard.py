"""Everything that runs before routing: request ids, CORS preflight, auth, body limits."""

from __future__ import annotations

import hmac
import logging
import os
import re
import time

from flask import Flask
from flask import Response
from flask import g
from flask import request

from collector.errors import error_response
from collector.log_format import redact_query
from collector.settings import Settings

# Routes that reveal nothing about jobs: uptime checks, readiness probes, the static
# page (and its files, collector/ui.py), the API's description, and (unless
# COLLECTOR_METRICS_AUTH=token) the metrics.
METRICS_PATH = "/metrics"
PAGE_PATHS = frozenset({"/", "/index.html", "/app.css", "/util.js", "/client.js", "/live.js", "/blobs.js",
                        "/state.js", "/table.js", "/clusters.js", "/detail.js", "/feed.js", "/app.js"})
OPEN_PATHS = frozenset({"/api/health", "/api/ready", "/api/openapi.json", METRICS_PATH}) | PAGE_PATHS
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
CORS_METHODS = "GET, HEAD, OPTIONS"
access_log = logging.getLogger("collector.access")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def request_id_for(incoming: str | None) -> str:
    """A proxy's X-Request-ID when it is well formed (one request followed across hops), else a new id."""
    return incoming if incoming and _REQUEST_ID.match(incoming) else os.urandom(16).hex()


def _request_id() -> str:
    return request_id_for(request.headers.get("X-Request-ID"))


def _bearer() -> str | None:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _matches(given: str | None, expected: str | None) -> bool:
    if given is None or expected is None:
        return False
    return hmac.compare_digest(given.encode(), expected.encode())


def open_paths(settings: Settings) -> frozenset[str]:
    """The paths served without a token under ``settings``."""
    return OPEN_PATHS if settings.metrics_auth == "open" else OPEN_PATHS - {METRICS_PATH}


class Guard:
    """The checks every request passes, in the order the spec requires."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.any_origin = "*" in settings.cors_origins
        self.origins = frozenset(settings.cors_origins)
        self.open_paths = open_paths(settings)

    def allowed_origin(self, origin: str | None) -> str | None:
        """The value for Access-Control-Allow-Origin, or None when the origin is not listed."""
        if not origin:
            return None
        if self.any_origin:
            return "*"
        return origin if origin in self.origins else None

    def before(self) -> Response | None:
        """Run before routing; a returned response ends the request there."""
        g.request_id = _request_id()
        g.started = time.perf_counter()
        if request.method == "OPTIONS":
            return self.preflight()
        denied = self.authenticate()
        if denied is not None:
            return denied
        return self.check_body()

    def preflight(self) -> Response:
        """Answer OPTIONS before auth: it carries no token and reveals nothing."""
        response = Response(status=204)
        response.headers["Allow"] = CORS_METHODS
        allowed = self.allowed_origin(request.headers.get("Origin"))
        if allowed:
            response.headers["Access-Control-Allow-Origin"] = allowed
            response.headers["Access-Control-Allow-Methods"] = CORS_METHODS
            # Last-Event-ID: a page resuming a stream with fetch sends it (EventSource does too).
            response.headers["Access-Control-Allow-Headers"] = "Authorization, Last-Event-ID"
            response.headers["Access-Control-Max-Age"] = "600"
        return response

    def authenticate(self) -> Response | None:
        """401 for a missing or wrong token, 403 for the read token on a write."""
        settings = self.settings
        if request.path in self.open_paths or not settings.write_token:
            return None
        token = _bearer()
        # Compare against both tokens every time so timing does not tell which one matched.
        is_writer = _matches(token, settings.write_token)
        is_reader = _matches(token, settings.read_token)
        if not (is_writer or is_reader):
            detail = "missing bearer token" if token is None else "invalid bearer token"
            return error_response(401, detail, {"WWW-Authenticate": "Bearer"})
        if not is_writer and request.method not in READ_METHODS:
            return error_response(403, "the read token cannot write; use the write token")
        return None

    def check_body(self) -> Response | None:
        """413 from Content-Length before a byte of the body is read."""
        length = request.content_length
        if length is not None and length > self.settings.max_body_bytes:
            return error_response(413, f"body of {length} bytes exceeds the {self.settings.max_body_bytes}-byte limit")
        return None

    def after(self, response: Response) -> Response:
        """Stamp the request id and, for reads from a listed origin, CORS headers."""
        response.headers["X-Request-ID"] = g.get("request_id", "")
        if request.method in ("GET", "HEAD"):
            allowed = self.allowed_origin(request.headers.get("Origin"))
            if allowed:
                response.headers["Access-Control-Allow-Origin"] = allowed
                response.headers["Access-Control-Expose-Headers"] = "X-Request-ID"
                if allowed != "*":
                    response.vary.add("Origin")
        self.log(response)
        return response

    def log(self, response: Response) -> None:
        """One access line per request, carrying the id the client saw (never a token)."""
        if not access_log.isEnabledFor(logging.INFO):
            return
        elapsed_ms = (time.perf_counter() - g.get("started", time.perf_counter())) * 1000
        # A token a client put in the URL must not reach the log: credential-like values are replaced.
        query = redact_query(request.query_string.decode(errors="replace"))
        # The same facts as keys, for the JSON format (COLLECTOR_LOG_FORMAT=json); bytes is
        # None for a streamed body, whose length is unknown when the line is written.
        fields = {
            "method": request.method,
            "path": request.path,
            "query": query or None,
            "status": response.status_code,
            "duration_ms": round(elapsed_ms, 1),
            "bytes": response.content_length,
            "remote": request.remote_addr,
        }
        access_log.info(
            '%s "%s %s" %d %.1fms request_id=%s',
            request.remote_addr or "-",
            request.method,
            f"{request.path}?{query}" if query else request.path,
            response.status_code,
            elapsed_ms,
            g.get("request_id", "-"),
            extra=fields,
        )


def init_app(app: Flask, settings: Settings) -> None:
    """Install the guard as the first before-request hook and the last after-request hook."""
    guard = Guard(settings)
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    app.before_request_funcs.setdefault(None, []).insert(0, guard.before)
    app.after_request(guard.after)
