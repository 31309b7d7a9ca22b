"""One JSON error envelope, ``{"detail": ..., "request_id": ...}``, for every failure."""

from __future__ import annotations

import logging
from typing import Any

from flask import Flask
from flask import Response
from flask import g
from flask import json
from pydantic import ValidationError
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from werkzeug.exceptions import HTTPException
from werkzeug.exceptions import MethodNotAllowed

from collector.store import errors as store_errors

log = logging.getLogger("collector")
# Seconds a client should wait after a 503 that names no other delay.
RETRY_AFTER_S = "1"


class APIError(Exception):
    """An error with an HTTP status, a message for the client and optional headers."""

    status = 400

    def __init__(self, detail: str, *, status: int | None = None, headers: dict[str, str] | None = None,
                 extra: dict[str, Any] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        if status is not None:
            self.status = status
        self.headers = headers or {}
        self.extra = extra or {}


class Unprocessable(APIError):
    status = 422


# The HTTP answer to each of the store's errors; a subclass takes its nearest listed base's.
STORE_ERROR_STATUS: dict[type[store_errors.StoreError], int] = {
    store_errors.NotFound: 404,
    store_errors.Conflict: 409,
    store_errors.Unprocessable: 422,
}


def store_error_status(exc: store_errors.StoreError) -> int:
    """The status that answers ``exc``: its class's entry in STORE_ERROR_STATUS, else 400."""
    for cls in type(exc).__mro__:
        if cls in STORE_ERROR_STATUS:
            return STORE_ERROR_STATUS[cls]
    return 400


def error_response(status: int, detail: str, headers: dict[str, str] | None = None, **extra: Any) -> Response:
    """Build the envelope response; every error path ends here."""
    body = {"detail": detail, "request_id": g.get("request_id"), **extra}
    response = Response(json.dumps(body), status=status, mimetype="application/json")
    for name, value in (headers or {}).items():
        response.headers[name] = value
    return response


def validation_detail(exc: ValidationError, where: str, *, name: str | None = None) -> tuple[str, list[dict[str, Any]]]:
    """Summarise a pydantic error as one sentence plus a list of ``{loc, msg}`` entries.

    ``where`` is the request part (body, query, path); ``name`` names a lone value there.
    """
    errors = []
    for item in exc.errors(include_url=False, include_context=False, include_input=False):
        loc = [where, *([name] if name else []), *[str(part) for part in item["loc"]]]
        errors.append({"loc": loc, "msg": item["msg"], "type": item["type"]})
    if name:
        return f"invalid {name.replace('_', ' ')} in the {where}: {errors[0]['msg']}", errors
    summary = "; ".join(f"{'.'.join(e['loc'][1:]) or where}: {e['msg']}" for e in errors)
    return f"invalid {where}: {summary}", errors


def init_app(app: Flask) -> None:
    """Register the envelope for our errors, HTTP errors and anything unexpected."""

    @app.errorhandler(APIError)
    def on_api_error(exc: APIError) -> Response:
        return error_response(exc.status, exc.detail, exc.headers, **exc.extra)

    @app.errorhandler(store_errors.StoreError)
    def on_store_error(exc: store_errors.StoreError) -> Response:
        return error_response(store_error_status(exc), exc.detail, **exc.data)

    @app.errorhandler(HTTPException)
    def on_http_error(exc: HTTPException) -> Response:
        headers = {}
        # Only MethodNotAllowed (werkzeug's one 405) carries the methods the route allows.
        if isinstance(exc, MethodNotAllowed) and exc.valid_methods:
            headers["Allow"] = ", ".join(sorted(exc.valid_methods))
        return error_response(exc.code or 500, exc.description or exc.name, headers)

    @app.errorhandler(OperationalError)
    @app.errorhandler(PoolTimeout)
    def on_database_unavailable(exc: Exception) -> Response:
        # Unreachable, restarting or overloaded database: the client should retry, and
        # the reporter's fire-and-forget retry treats 503 like a network error.
        log.warning("database unavailable [request_id=%s]: %s", g.get("request_id"), str(exc).splitlines()[0])
        # Retry-After comes from retry_after_every_503 below, like every other 503's.
        return error_response(503, "database unavailable; try again")

    @app.after_request
    def retry_after_every_503(response: Response) -> Response:
        # A 503 means "come back later": say when, whichever path produced it (a route
        # or handler added later included), so clients back off instead of hammering.
        if response.status_code == 503 and "Retry-After" not in response.headers:
            response.headers["Retry-After"] = RETRY_AFTER_S
        return response

    @app.errorhandler(Exception)
    def on_unexpected(exc: Exception) -> Response:
        log.exception("unhandled error [request_id=%s]", g.get("request_id"))
        return error_response(500, "internal server error; the request id is in the server log")
