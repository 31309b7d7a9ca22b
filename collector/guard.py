"""Everything that runs before routing: request ids, CORS preflight, auth, body limits."""

from __future__ import annotations

import logging
import os
import re
import time
from typing import Any

from flask import Flask
from flask import Response
from flask import g
from flask import request

from collector import metrics
from collector.credentials import Credential
from collector.credentials import Keyring
from collector.credentials import keyring_for
from collector.errors import error_response
from collector.log_format import redact_query
from collector.settings import Settings

# Routes that reveal nothing about jobs: uptime checks, readiness probes, the static
# page (and its files, collector/ui.py), the API's description, and (when
# settings.metrics_open) the metrics.
METRICS_PATH = "/metrics"
PAGE_PATHS = frozenset({"/", "/index.html", "/app.css", "/util.js", "/client.js", "/live.js", "/blobs.js",
                        "/state.js", "/table.js", "/clusters.js", "/detail.js", "/feed.js", "/app.js"})
OPEN_PATHS = frozenset({"/api/health", "/api/ready", "/api/openapi.json", METRICS_PATH}) | PAGE_PATHS
CORS_METHODS = "GET, HEAD, OPTIONS"
access_log = logging.getLogger("collector.access")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def request_id_for(incoming: str | None) -> str:
    """A proxy's X-Request-ID when it is well formed (one request followed across hops), else a new id."""
    return incoming if incoming and _REQUEST_ID.match(incoming) else os.urandom(16).hex()


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` value, else None."""
    scheme, _, token = (authorization or "").partition(" ")
    token = token.strip()
    return token if token and scheme.lower() == "bearer" else None


def open_paths(settings: Settings) -> frozenset[str]:
    """The paths served without a token under ``settings``."""
    return OPEN_PATHS if settings.metrics_open else OPEN_PATHS - {METRICS_PATH}


def credential() -> Credential | None:
    """The credential of the current request (None on an open server or an open path)."""
    found: Credential | None = g.get("credential")
    return found


def keyring_of(app: Flask) -> Keyring:
    """The credentials ``app`` checks requests against."""
    keyring: Keyring = app.extensions["collector.keyring"]
    return keyring


class Guard:
    """The checks every request passes, in the order the spec requires."""

    def __init__(self, settings: Settings, keyring: Keyring) -> None:
        self.settings = settings
        self.keyring = keyring
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
        # Every request runs this: the WSGI environ and the context's g are read directly,
        # not through Flask's proxies and werkzeug's header and property layers, each of
        # whose lookups costs more than the check it serves (docs/performance.md).
        environ = request.environ
        context = g._get_current_object()
        context.request_id = request_id_for(environ.get("HTTP_X_REQUEST_ID"))
        context.started = time.perf_counter()
        if environ["REQUEST_METHOD"] == "OPTIONS":
            return self.preflight()
        denied = self.authenticate(environ, context)
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

    def authenticate(self, environ: dict[str, Any], context: Any) -> Response | None:
        """401 for a missing or unknown token, 403 for a method the credential's role does not allow.

        Cluster scope needs the body, so the views check it (collector/api, ``write_cluster``).
        """
        if not self.keyring.enabled or request.path in self.open_paths:
            return None
        token = bearer_token(environ.get("HTTP_AUTHORIZATION"))
        # By digest: the lookup costs the same whichever credential, if any, the token is.
        found = self.keyring.lookup(token)
        if found is None:
            detail = "missing bearer token" if token is None else "invalid bearer token"
            return error_response(401, detail, {"WWW-Authenticate": "Bearer"})
        context.credential = found
        refusal = found.refusal(environ["REQUEST_METHOD"])
        if refusal is not None:
            return error_response(403, refusal)
        return None

    def check_body(self) -> Response | None:
        """413 from Content-Length before a byte of the body is read."""
        length = request.content_length
        if length is not None and length > self.settings.max_body_bytes:
            return error_response(413, f"body of {length} bytes exceeds the {self.settings.max_body_bytes}-byte limit")
        return None

    def after(self, response: Response) -> Response:
        """Stamp the request id and, for reads from a listed origin, CORS headers."""
        environ = request.environ
        response.headers["X-Request-ID"] = g.get("request_id", "")
        if self.origins and environ["REQUEST_METHOD"] in ("GET", "HEAD"):
            allowed = self.allowed_origin(environ.get("HTTP_ORIGIN"))
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
        # Every request of a default deployment writes this line: read the environ and g
        # once, not through a proxy per field (docs/performance.md).
        environ = request.environ
        context = g._get_current_object()
        started = getattr(context, "started", None)
        elapsed_ms = (time.perf_counter() - started) * 1000 if started is not None else 0.0
        # A token a client put in the URL must not reach the log: credential-like values are replaced.
        query = redact_query(request.query_string.decode(errors="replace"))
        method, path, remote = environ["REQUEST_METHOD"], request.path, environ.get("REMOTE_ADDR")
        # Who made the request: a credential's name, never its secret.
        name = found.name if (found := credential()) else None
        # The same facts as keys, for the JSON format (COLLECTOR_LOG_FORMAT=json); bytes is
        # None for a streamed body, whose length is unknown when the line is written.
        fields = {
            "method": method,
            "path": path,
            "query": query or None,
            "status": response.status_code,
            "duration_ms": round(elapsed_ms, 1),
            "bytes": response.content_length,
            "remote": remote,
            "credential": name,
        }
        access_log.info(
            '%s "%s %s" %d %.1fms request_id=%s credential=%s',
            remote or "-",
            method,
            f"{path}?{query}" if query else path,
            response.status_code,
            elapsed_ms,
            getattr(context, "request_id", "-"),
            name or "-",
            extra=fields,
        )


def init_app(app: Flask, settings: Settings) -> None:
    """Install the guard as the first before-request hook and the last after-request hook."""
    keyring = keyring_for(settings)
    keyring.on_reload = metrics.tokens_file_reloaded
    app.extensions["collector.keyring"] = keyring
    guard = Guard(settings, keyring)
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    app.before_request_funcs.setdefault(None, []).insert(0, guard.before)
    app.after_request(guard.after)
