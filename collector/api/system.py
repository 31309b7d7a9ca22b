"""Liveness and readiness probes."""

from __future__ import annotations

from flask import Blueprint
from flask import jsonify
from sqlalchemy.exc import SQLAlchemyError

from collector.db import get_db
from collector.migrations import current_revision
from collector.migrations import head_revision

bp = Blueprint("system", __name__, url_prefix="/api")


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
        reason = str(exc.orig if getattr(exc, "orig", None) else exc).strip().splitlines()[0][:200]
        return jsonify(status="unavailable", database=f"unreachable: {reason}", revision=None), 503
    head = head_revision()
    if revision != head:
        at = f"at {revision}" if revision else "not migrated"
        problem = f"schema {at}, code needs {head}: run `collector db upgrade`"
        return jsonify(status="unavailable", database=problem, revision=revision), 503
    return jsonify(status="ok", database="ok", revision=revision)
