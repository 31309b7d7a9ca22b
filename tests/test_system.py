"""/api/health and /api/ready against reachable, unreachable and out-of-date databases."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine
from sqlalchemy import text

from collector.app import CollectorFlask
from collector.app import create_app
from collector.migrations import head_revision
from collector.migrations import upgrade
from collector.settings import Settings


def test_ready_reports_database_and_revision(api):
    response = api.get("/api/ready", token=None)
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "database": "ok", "revision": head_revision()}


def test_ready_is_503_when_the_schema_is_missing(serve, new_database):
    server = serve(database_url=new_database())
    response = server.get("/api/ready")
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "5"
    assert response.json() == {
        "status": "unavailable",
        "database": f"schema not migrated, code needs {head_revision()}: run `collector db upgrade`",
        "revision": None,
    }


def set_revision(url: str, revision: str) -> None:
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = :r"), {"r": revision})
    engine.dispose()


def test_ready_is_503_when_the_schema_is_behind(serve, new_database):
    url = new_database()
    upgrade(url, "0001")
    server = serve(database_url=url)
    response = server.get("/api/ready")
    assert response.status_code == 503
    assert response.json() == {
        "status": "unavailable",
        "database": f"schema at 0001, code needs {head_revision()}: run `collector db upgrade`",
        "revision": "0001",
    }


def test_ready_while_the_schema_is_already_newer_than_this_code(serve, new_database):
    # Mid-upgrade: the migration ran, the old processes still serve until replaced.
    url = new_database()
    upgrade(url)
    set_revision(url, "9999_from_newer_code")
    server = serve(database_url=url)
    response = server.get("/api/ready")
    assert response.status_code == 200
    assert response.json()["revision"] == "9999_from_newer_code"


def test_ready_is_503_when_the_database_is_unreachable(serve, tmp_path):
    url = "postgresql+psycopg://nobody@127.0.0.1:1/none"
    server = serve(database_url=url)
    response = server.get("/api/ready")
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "5"
    body = response.json()
    assert body == {"status": "unavailable", "database": "unreachable (OperationalError); see the server log",
                    "revision": None}
    # The probe is open: it must not tell strangers where the database lives.
    assert "127.0.0.1" not in response.text and "nobody" not in response.text
    # Liveness does not depend on the database.
    assert server.get("/api/health").json() == {"status": "ok"}


def test_database_errors_on_api_routes_are_503_not_500(serve):
    server = serve(database_url="postgresql+psycopg://nobody@127.0.0.1:1/none")
    response = server.get("/api/jobs")
    assert response.status_code == 503
    assert response.json()["detail"] == "database unavailable; try again"
    assert response.headers["Retry-After"] == "1"


@pytest.mark.parametrize("path", ["/api/events/stream", "/api/jobs/1/events/stream", "/api/clusters/stream"])
def test_a_stream_refused_for_want_of_a_slot_says_when_to_retry(serve, path):
    server = serve(write_token="w", max_streams=0)
    body = {"status": "workers", "updated_at": "2025-01-26T10:35:00Z"}
    assert server.put("/api/jobs/1", json=body).status_code == 200
    response = server.get(path, stream=True)
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "5"
    assert response.json()["detail"].endswith("retry shortly")


def test_ready_replays_on_a_fresh_connection_after_the_database_dropped_them_all(postgres, serve):
    server = serve(write_token="w")
    assert server.get("/api/ready").status_code == 200
    killed = postgres.scalar(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    # Proof that the probe's pooled connection was among them.
    assert killed >= 1
    response = server.get("/api/ready")
    assert response.status_code == 200, response.text
    assert response.json() == {"status": "ok", "database": "ok", "revision": head_revision()}


def test_requests_survive_the_database_dropping_every_connection(postgres, serve):
    server = serve(write_token="w")
    body = {"status": "workers", "updated_at": "2025-01-26T10:35:00Z"}
    assert server.put("/api/jobs/dbk", json=body).status_code == 200
    assert server.get("/api/jobs/dbk").status_code == 200
    killed = postgres.scalar(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    assert killed >= 1
    # The pooled connection is dead; the collector replays on a fresh one instead of failing.
    response = server.put("/api/jobs/dbk", json={**body, "status": "frontend"})
    assert response.status_code == 200, response.text
    postgres.scalar(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    read = server.get("/api/jobs/dbk")
    assert read.status_code == 200 and read.json()["status"] == "frontend"


def test_the_apps_coroutine_check_is_kept_per_function_and_capped(tmp_path):
    # Flask asks, per request, whether each hook and view is a coroutine function; the app
    # keeps the answer, but never for more functions than a real app registers.
    app = create_app(Settings(database_url=f"sqlite:///{tmp_path / 'c.db'}"))
    functions = [(lambda: None) for _ in range(CollectorFlask._SYNC_CACHE_LIMIT + 100)]
    assert [app.ensure_sync(f) for f in functions] == functions
    assert len(app._sync_cache) == CollectorFlask._SYNC_CACHE_LIMIT  # type: ignore[attr-defined]
    assert app.ensure_sync(functions[-1]) is functions[-1]
