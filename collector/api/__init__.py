"""HTTP views: validate with pydantic, call the store, commit once, answer with a model."""

from __future__ import annotations

import json
import math
import re
from typing import TypeVar

from flask import Response
from flask import current_app
from flask import request
from pydantic import BaseModel
from pydantic import TypeAdapter
from pydantic import ValidationError
from werkzeug.sansio.utils import get_content_length

from collector import guard
from collector.contract import TEXT_CHECKED
from collector.contract import Identifier
from collector.credentials import ENV_READ
from collector.credentials import OutOfScope
from collector.errors import APIError
from collector.errors import Unprocessable
from collector.errors import validation_detail

M = TypeVar("M", bound=BaseModel)
_JOB_ID = TypeAdapter(Identifier)


def checked_job_id(job_id: str) -> str:
    """The path's job id, held to the same rule as a POSTed one."""
    try:
        return _JOB_ID.validate_python(job_id)
    except ValidationError as exc:
        detail, errors = validation_detail(exc, "path", name="job_id")
        raise Unprocessable(detail, extra={"errors": errors}) from None


def write_cluster(named: str | None) -> str | None:
    """The cluster a write naming ``named`` lands on under the request's credential: 403 outside its scope."""
    found = guard.credential()
    if found is None:
        return named
    try:
        return found.cluster_for(named)
    except OutOfScope as exc:
        raise APIError(str(exc), status=403, extra={"clusters": exc.clusters}) from None


def writer() -> str | None:
    """The name of the request's credential, kept on the events it writes (None on an open server)."""
    found = guard.credential()
    return found.name if found is not None else None


def admin(what: str) -> str | None:
    """The request's credential name when it is an admin's (the spec's write token is); else a 403 naming ``what``.

    None on an open server, where every request may do everything.
    """
    found = guard.credential()
    if found is None:
        return None
    if found.role != "admin":
        who = "the read token" if found.name == ENV_READ else f"credential {found.name!r} has the {found.role} role:"
        raise APIError(f"{who} cannot manage {what}: that needs an admin credential or the write token", status=403)
    return found.name


def read_body() -> bytes:
    """The whole request body: 413 past the limit, 400 if it arrived short of its length."""
    # Straight from the WSGI input: werkzeug's get_data wraps it in a limiting stream per
    # request, and the guard has already refused a Content-Length past the limit (413).
    environ = request.environ
    length = get_content_length(environ.get("CONTENT_LENGTH"), environ.get("HTTP_TRANSFER_ENCODING"))
    chunked = length is None and "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower()
    if not length and not chunked:
        # Without Content-Length or chunking there is no body at all, and reading the raw
        # input would wait on the socket for bytes that never come.
        return b""
    # A chunked body has no length for the guard to check up front: read one byte past
    # the limit to tell.
    limit: int = current_app.config["MAX_CONTENT_LENGTH"]
    wanted = limit + 1 if length is None else length
    try:
        data: bytes = environ["wsgi.input"].read(wanted)
    except (OSError, ValueError):
        # The client reset the connection, or the server closed the input: its doing, not
        # a server error (werkzeug's own stream says ClientDisconnected for the same).
        raise APIError("body ended before it was complete; nothing was stored", status=400) from None
    if length is None:
        if len(data) > limit:
            raise APIError(f"chunked body exceeds the {limit}-byte limit", status=413)
        return data
    if len(data) < length:
        raise APIError("body ended before its Content-Length; nothing was stored", status=400)
    return data


def _finite_or_null(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) else None


# Python's json.dumps, and so a reporter's metrics, writes NaN and Infinity, which JSON has
# no value for: PostgreSQL's jsonb refuses them (a 500, and the report lost) and SQLite's
# JSON text reads them back as null. They become null on the way in, on every backend, as
# does a number too large for a float (1e999), so the rest of the report is kept.
_JSON = json.JSONDecoder(parse_float=_finite_or_null, parse_constant=lambda _constant: None)


_MAYBE_UNSTORABLE = re.compile(rb"\\u0000|\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")


def parse_body(model: type[M]) -> M:
    """Decode a JSON object body into ``model``: 400 for bad JSON, 422 for bad fields."""
    raw = read_body()
    try:
        data = _JSON.decode(raw.decode(json.detect_encoding(raw), "surrogatepass"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise APIError(f"body is not valid JSON: {exc}", status=400) from None
    if not isinstance(data, dict):
        raise Unprocessable(f"body must be a JSON object, got {type(data).__name__}")
    # JSON carries a NUL only as the escape \u0000 (a raw one is invalid JSON), and a lone
    # surrogate as an escape or as the UTF-8-like bytes surrogatepass decoded, so a body
    # without them spares the validator its walk over every value.
    context = None if _MAYBE_UNSTORABLE.search(raw) else {TEXT_CHECKED: True}
    try:
        return model.model_validate(data, context=context)
    except ValidationError as exc:
        detail, errors = validation_detail(exc, "body")
        raise Unprocessable(detail, extra={"errors": errors}) from None


def parse_query(model: type[M]) -> M:
    """Validate query parameters into ``model``; repeated parameters keep the first value."""
    try:
        return model.model_validate({key: request.args.get(key) for key in request.args})
    except ValidationError as exc:
        detail, errors = validation_detail(exc, "query")
        raise Unprocessable(detail, extra={"errors": errors}) from None


def respond(model: BaseModel, status: int = 200) -> Response:
    """Serialise a response model."""
    return Response(model.model_dump_json(), status=status, mimetype="application/json")
