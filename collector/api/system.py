"""Liveness and readiness probes."""

from __future__ import annotations

import logging

from flask import Blueprint
from flask import g
from flask import jsonify
from sqlalchemy.exc import SQLAlchemyError

from collector.db import get_db
from collector.migrations import current_revision
from collector.migrations import head_revision
from collector.migrations import is_behind

bp = Blueprint("system", __name__, url_prefix="/api")
log = logging.getLogger("collector")


@bp.get("/health")
def health():
    """The process is up; says nothing else."""
    return jsonify(status="ok")


@bp.get("/ready")
def ready():
    """The database answers and its schema is the one this code needs."""
    try:
        revision = current_revision(get_db().engine)
    except SQLAlchemyError as exc:
        # The probe is open: name the failure's kind, keep hosts and ports for the log.
        log.warning("readiness: database unreachable [request_id=%s]: %s", g.get("request_id"),
                    str(exc).strip().splitlines()[0])
        kind = type(getattr(exc, "orig", None) or exc).__name__
        return jsonify(status="unavailable", database=f"unreachable ({kind}); see the server log",
                       revision=None), 503
    head = head_revision()
    if is_behind(revision):
        at = f"at {revision}" if revision else "not migrated"
        problem = f"schema {at}, code needs {head}: run `collector db upgrade`"
        return jsonify(status="unavailable", database=problem, revision=revision), 503
    return jsonify(status="ok", database="ok", revision=revision)
