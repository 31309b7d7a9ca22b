"""Liveness and readiness probes."""

from __future__ import annotations

import logging

from flask import Blueprint
from flask import Response
from flask import current_app
from flask import g
from flask import jsonify
from sqlalchemy.exc import SQLAlchemyError

from collector.api import respond
from collector.contract import HealthResponse
from collector.contract import ReadyResponse
from collector.db import get_db
from collector.migrations import head_revision
from collector.migrations import is_behind
from collector.migrations import revision_of
from collector.openapi import JSON
from collector.openapi import operation
from collector.openapi import served

bp = Blueprint("system", __name__, url_prefix="/api")
log = logging.getLogger("collector")
# Seconds a client should wait before probing readiness again (a restart takes a few).
READY_RETRY_AFTER_S = 5


@bp.get("/health")
@operation(responses={200: HealthResponse})
def health() -> Response:
    """The process is up; says nothing else."""
    return respond(HealthResponse(status="ok"))


@bp.get("/openapi.json")
@operation(responses={200: {JSON: {"type": "object", "description": "this document"}}})
def openapi_document() -> Response:
    """The OpenAPI 3.1 document of this collector, built from its routes and models."""
    return jsonify(served(current_app))


def unavailable(body: ReadyResponse) -> Response:
    """A 503 readiness answer; load balancers and clients may probe again after Retry-After."""
    response = respond(body, 503)
    response.headers["Retry-After"] = str(READY_RETRY_AFTER_S)
    return response


@bp.get("/ready")
@operation(responses={200: ReadyResponse, 503: ReadyResponse})
def ready() -> Response:
    """The database answers and its schema is the one this code needs."""
    try:
        # Through Database.run, so a pooled connection that died with a database restart
        # is replayed on a fresh one instead of failing the probe.
        revision = get_db().run(revision_of)
    except SQLAlchemyError as exc:
        # The probe is open: name the failure's kind, keep hosts and ports for the log.
        log.warning("readiness: database unreachable [request_id=%s]: %s", g.get("request_id"),
                    str(exc).strip().splitlines()[0])
        kind = type(getattr(exc, "orig", None) or exc).__name__
        return unavailable(ReadyResponse(status="unavailable", database=f"unreachable ({kind}); see the server log",
                                         revision=None))
    head = head_revision()
    if is_behind(revision):
        at = f"at {revision}" if revision else "not migrated"
        problem = f"schema {at}, code needs {head}: run `collector db upgrade`"
        return unavailable(ReadyResponse(status="unavailable", database=problem, revision=revision))
    return respond(ReadyResponse(status="ok", database="ok", revision=revision))
