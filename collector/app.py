"""The app factory: the only way to build the collector's Flask app."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from flask import Flask

from collector import db
from collector import errors
from collector import fanout
from collector import guard
from collector import janitor
from collector import metrics
from collector import ui
from collector import webhook_delivery
from collector.admission import Admission
from collector.api import captures
from collector.api import cluster_stream
from collector.api import clusters
from collector.api import events
from collector.api import jobs
from collector.api import logs
from collector.api import streams
from collector.api import system
from collector.api import webhooks
from collector.cli import db_group
from collector.migrations import schema_problem
from collector.migrations import settle_event_ids
from collector.migrations import upgrade
from collector.settings import Settings
from collector.settings import SettingsError


class CollectorFlask(Flask):
    """Flask, without asking on every request whether each hook and view is a coroutine."""

    _SYNC_CACHE_LIMIT = 1024

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sync_cache: dict[Callable[..., Any], Callable[..., Any]] = {}

    def ensure_sync(self, func: Callable[..., Any]) -> Callable[..., Any]:
        """Flask's answer for ``func``, found once: a registered function does not turn async."""
        # Flask runs inspect's coroutine check for every hook and the view of every request
        # (six per PUT, about 2% of its time). The cache is capped in case something ever
        # passes per-request functions through here.
        sync = self._sync_cache.get(func)
        if sync is None:
            sync = super().ensure_sync(func)
            if len(self._sync_cache) < self._SYNC_CACHE_LIMIT:
                self._sync_cache[func] = sync
        return sync


def create_app(settings: Settings | None = None) -> Flask:
    """Build the app from ``settings`` (default: read from the environment)."""
    settings = settings or Settings.from_env()
    app = CollectorFlask(__name__, static_folder=None)
    app.config["COLLECTOR_SETTINGS"] = settings
    # The provider is Flask's DefaultJSONProvider, which has sort_keys; the declared base has not.
    app.json.sort_keys = False  # type: ignore[attr-defined]
    guard.init_app(app, settings)
    errors.init_app(app)
    database = db.Database(settings)
    db.init_app(app, database)
    fanout.init_app(app, database, settings)
    metrics.init_app(app, database, fanout.get_hub(app))
    janitor.init_app(app, database, settings)
    webhook_delivery.init_app(app, database, settings)
    cluster_stream.init_app(app, database)
    for blueprint in (system.bp, jobs.bp, cluster_stream.bp, clusters.bp, logs.bp, captures.bp, events.bp,
                      streams.bp, webhooks.bp, ui.bp):
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
