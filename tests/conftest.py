"""Fixtures: real databases (SQLite always, PostgreSQL when asked), live servers on ephemeral ports, recorders."""

from __future__ import annotations

import dataclasses
import os
import threading
import uuid
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import Engine
from sqlalchemy import create_engine
from sqlalchemy import make_url
from sqlalchemy import text
from sqlalchemy.pool import NullPool
from werkzeug.serving import BaseWSGIServer
from werkzeug.serving import make_server

from collector.app import create_app
from collector.janitor import Clock
from collector.janitor import get_janitor
from collector.migrations import upgrade
from collector.settings import Settings
from collector.settings import database_url as normalise_url
from collector.store import counts
from tests.helpers import CHROMIUM
from tests.helpers import CHROMIUM_ARGS
from tests.helpers import WAIT_MS
from tests.helpers import LiveServer
from tests.helpers import Recorder
from tests.helpers import Script
from tests.helpers import stop_app

PG_URL = os.environ.get("COLLECTOR_TEST_DATABASE_URL")
# CI sets this: a skipped test is then a failure, except a PostgreSQL-only test in the
# SQLite run (the PostgreSQL run, where nothing may skip, covers it).
STRICT = os.environ.get("COLLECTOR_TEST_STRICT") == "1"
NEEDS_POSTGRES = "needs PostgreSQL: set COLLECTOR_TEST_DATABASE_URL"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if STRICT and report.skipped:
        reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if not (PG_URL is None and NEEDS_POSTGRES in reason):
            report.outcome = "failed"
            report.longrepr = f"skipped under COLLECTOR_TEST_STRICT=1: {reason}"


def pytest_report_header(config):
    return f"collector database: {'PostgreSQL ' + make_url(PG_URL).render_as_string() if PG_URL else 'SQLite'}"


# What a test's clean slate empties, children first. Not webhook_cursor: its one row
# stays, at a position event ids only grow past.
CLEANED = ("webhook_deliveries", "slurm_jobs", "cluster_probes", "blob_chunks", "blob_files", "job_events", "jobs",
           "job_counts", "job_count_stripes", "credential_uses", "webhooks")


@dataclasses.dataclass
class TestDatabase:
    """A migrated database for this test session, and an engine to inspect it."""

    url: str
    engine: Engine

    @property
    def is_postgres(self) -> bool:
        return self.url.startswith("postgresql")

    def clean(self) -> None:
        if self.is_postgres:
            with self.engine.begin() as conn:
                conn.execute(text(f"TRUNCATE {', '.join(CLEANED)} RESTART IDENTITY CASCADE"))
            return
        with self.engine.begin() as conn:
            # Children first: this inspection engine does not turn on SQLite's foreign keys.
            for table in CLEANED:
                conn.execute(text(f"DELETE FROM {table}"))

    def assert_counts_match_jobs(self) -> None:
        """The maintained per-(cluster, status) counts equal a fresh GROUP BY over jobs."""
        with self.engine.connect() as conn:
            kept = {(c, s): n for c, statuses in counts.by_cluster(conn).items() for s, n in statuses.items()}
            real = dict(((c, s), n) for c, s, n in conn.execute(
                text("SELECT cluster, status, count(*) FROM jobs GROUP BY cluster, status")))
        assert kept == real

    def count_of(self, cluster: str, status: str) -> int:
        """The maintained count of ``cluster``'s jobs in ``status``."""
        with self.engine.connect() as conn:
            return counts.total(conn, cluster=cluster, status=status)

    def scalar(self, sql: str, **params):
        with self.engine.connect() as conn:
            return conn.execute(text(sql), params).scalar()

    def row(self, sql: str, **params):
        """The one row ``sql`` selects, as a tuple."""
        with self.engine.connect() as conn:
            return tuple(conn.execute(text(sql), params).one())


@pytest.fixture(scope="session")
def new_database(tmp_path_factory):
    """Factory: an empty, unmigrated database URL of the backend under test (dropped at the end)."""
    created: list[str] = []

    def make() -> str:
        if not PG_URL:
            return "sqlite:///" + str(tmp_path_factory.mktemp("db") / "collector.db")
        base = make_url(normalise_url(PG_URL))
        name = f"collector_test_{uuid.uuid4().hex[:12]}"
        admin = create_engine(base, isolation_level="AUTOCOMMIT", poolclass=NullPool)
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        admin.dispose()
        created.append(name)
        return base.set(database=name).render_as_string(hide_password=False)

    yield make
    if created:
        admin = create_engine(make_url(normalise_url(PG_URL)), isolation_level="AUTOCOMMIT", poolclass=NullPool)
        with admin.connect() as conn:
            for name in created:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="session")
def database(new_database) -> Iterator[TestDatabase]:
    """The session's migrated database."""
    url = new_database()
    upgrade(url)
    engine = create_engine(url, poolclass=NullPool)
    yield TestDatabase(url=url, engine=engine)
    engine.dispose()


@pytest.fixture
def postgres(database) -> TestDatabase:
    """The session database, for tests that only make sense on PostgreSQL."""
    if not database.is_postgres:
        pytest.skip(NEEDS_POSTGRES)
    return database


@pytest.fixture
def serve(database: TestDatabase) -> Iterator[Callable[..., LiveServer]]:
    """Factory: start a collector on the session database with settings overrides.

    ``clock``: what time it is for the collector's stale-job janitor (tests/helpers.py FakeClock).
    """
    database.clean()
    servers: list[tuple[BaseWSGIServer, threading.Thread, Flask]] = []

    def start(*, clock: Clock | None = None, **overrides: Any) -> LiveServer:
        overrides.setdefault("database_url", database.url)
        settings = Settings(**overrides)
        app = create_app(settings)
        if clock is not None:
            get_janitor(app).clock = clock  # before the first request starts the janitor's thread
        server = make_server("127.0.0.1", 0, app, threaded=True)
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        servers.append((server, thread, app))
        return LiveServer(url=f"http://127.0.0.1:{server.server_port}", settings=settings,
                          token=settings.write_token, app=app)

    yield start
    for server, thread, app in servers:
        app.extensions["collector.streams"].close()  # ends open streams, so shutdown does not wait on them
        server.shutdown()
        thread.join(timeout=10)
        server.server_close()
        stop_app(app)


@pytest.fixture
def api(serve: Callable[..., LiveServer]) -> LiveServer:
    """A collector with a write token, the shape of a shared deployment."""
    return serve(write_token="w-" + uuid.uuid4().hex, read_token="r-" + uuid.uuid4().hex)


@pytest.fixture
def recorder() -> Iterator[Callable[..., Recorder]]:
    """Factory: start a Recorder (tests/helpers.py), stopped after the test."""
    started: list[Recorder] = []

    def start(upstream: str | None = None, script: Script | None = None) -> Recorder:
        started.append(Recorder(upstream, script))
        return started[-1]

    yield start
    for each in started:
        each.close()


@pytest.fixture(scope="module")
def second_database(new_database: Callable[[], str]) -> str:
    """Another migrated database of the backend under test, for a second collector."""
    url = new_database()
    upgrade(url)
    return url


@pytest.fixture
def second_api(serve: Callable[..., LiveServer], second_database: str, api: LiveServer) -> LiveServer:
    """A second collector with its own database and ``api``'s tokens (its jobs stay across the module's tests)."""
    return serve(database_url=second_database, write_token=api.token, read_token=api.settings.read_token)


# ---------------------------------------------------------------- a browser (tests/test_ui*.py)


def _playwright():
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"needs Debian's Chromium at {CHROMIUM} (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("needs Playwright for Python (pip install playwright; never `playwright install`)")
    return sync_playwright


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium for the module; each test gets a fresh context."""
    with _playwright()() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser):
    """A fresh page (own storage, UTC clock); an uncaught script error fails the test."""
    context = browser.new_context(viewport={"width": 1500, "height": 900}, timezone_id="UTC",
                                  accept_downloads=True)
    context.set_default_timeout(WAIT_MS)
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda error: errors.append(str(error)))
    yield tab
    context.close()
    assert errors == []
