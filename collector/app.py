"""The app factory: the only way to build the collector's Flask app."""

from __future__ import annotations

import logging

from flask import Flask

from collector import db
from collector import errors
from collector import fanout
from collector import guard
from collector import janitor
from collector import metrics
from collector import ui
from collector.admission import Admission
from collector.api import captures
from collector.api import cluster_stream
from collector.api import clusters
from collector.api import events
from collector.api import jobs
from collector.api import logs
from collector.api import streams
from collector.api import system
from collector.cli import db_group
from collector.migrations import schema_problem
from collector.migrations import settle_event_ids
from collector.migrations import upgrade
from collector.settings import Settings
from collector.settings import SettingsError


def create_app(settings: Settings | None = None) -> Flask:
    """Build the app from ``settings`` (default: read from the environment)."""
    settings = settings or Settings.from_env()
    app = Flask(__name__, static_folder=None)
    app.config["COLLECTOR_SETTINGS"] = settings
    # The provider is Flask's DefaultJSONProvider, which has sort_keys; the declared base has not.
    app.json.sort_keys = False  # type: ignore[attr-defined]
    guard.init_app(app, settings)
    errors.init_app(app)
    database = db.Database(settings)
    db.init_app(app, database)
    fanout.init_app(app, database, settings)
    metrics.init_app(app, database)
    janitor.init_app(app, database, settings)
    cluster_stream.init_app(app, database)
    for blueprint in (system.bp, jobs.bp, cluster_stream.bp, clusters.bp, logs.bp, captures.bp, events.bp,
                      streams.bp, ui.bp):
        app.register_blueprint(blueprint)
    app.cli.add_command(db_group)
    # Replacing wsgi_app is Flask's documented way to add WSGI middleware; mypy sees a method.
    app.wsgi_app = Admission(  # type: ignore[method-assign]
        app.wsgi_app, settings.request_threads, settings.queue_timeout_s, on_shed=metrics.request_shed)
    logger = logging.getLogger("collector")
    if logger.level == logging.NOTSET:
        # INFO by default (one line per transition); a logging config that set a level wins.
        logger.setLevel(logging.INFO)
    return app


def prepare_to_serve(app: Flask) -> None:
    """Before serving: refuse unsafe settings; migrate SQLite, or refuse an old PostgreSQL schema.

    Not part of create_app: `flask --app collector db upgrade` builds the app too, and a
    migration must not need the tokens or bind address that serving does. Nor is the
    tokens file checked here: each gunicorn worker runs this, and a worker must never
    die over the file (``credentials.check_file`` runs once, in the master).
    """
    settings: Settings = app.config["COLLECTOR_SETTINGS"]
    settings.check()
    engine = db.get_db_of(app).engine
    if settings.migrates_on_start:
        upgrade(settings.database_url)
        return
    problem = schema_problem(engine)
    if problem:
        raise SettingsError(problem)
    # A restore into a new cluster is served without an upgrade too: ids must stay in order.
    settle_event_ids(engine)
