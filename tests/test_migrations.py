"""Migrations: one head, upgrade from empty, down and up again, and no drift from the models."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine
from sqlalchemy import inspect
from sqlalchemy.pool import NullPool

from collector import migrations
from collector.models import Base


def test_single_head():
    script = ScriptDirectory.from_config(migrations.alembic_config("sqlite://"))
    assert len(script.get_heads()) == 1
    assert migrations.head_revision() == script.get_current_head()


def test_upgrade_from_empty_then_down_and_up(new_database):
    url = new_database()
    engine = create_engine(url, poolclass=NullPool)
    try:
        assert migrations.current_revision(engine) is None
        migrations.upgrade(url)
        assert migrations.current_revision(engine) == migrations.head_revision()
        assert {"jobs", "job_events", "alembic_version"} <= set(inspect(engine).get_table_names())
        migrations.downgrade(url, "base")
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
        migrations.upgrade(url)
        assert migrations.schema_problem(engine) is None
    finally:
        engine.dispose()


def test_models_and_migrations_agree(database):
    with database.engine.connect() as connection:
        context = MigrationContext.configure(
            connection,
            opts={"compare_type": True, "compare_server_default": database.is_postgres},
        )
        assert compare_metadata(context, Base.metadata) == []


def test_schema_problem_names_the_command(new_database):
    url = new_database()
    engine = create_engine(url, poolclass=NullPool)
    try:
        problem = migrations.schema_problem(engine)
        assert problem == (f"database schema is not migrated but this code needs {migrations.head_revision()}: "
                           "run `collector db upgrade`")
    finally:
        engine.dispose()


def test_job_counts_revision_backfills_existing_jobs(new_database):
    from sqlalchemy import text

    url = new_database()
    migrations.upgrade(url, "0001")
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.begin() as conn:
            for i, (cluster, status) in enumerate([("a", "completed"), ("a", "completed"), ("", "workers")]):
                conn.execute(text(
                    "INSERT INTO jobs (cluster, job_id, job_name, is_placeholder, status, submitted_at, updated_at)"
                    " VALUES (:c, :j, 'n', false, :s, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"),
                    {"c": cluster, "j": str(i), "s": status})
        migrations.upgrade(url)
        with engine.connect() as conn:
            counts = set(conn.execute(text("SELECT cluster, status, jobs FROM job_counts")))
        assert counts == {("a", "completed", 2), ("", "workers", 1)}
    finally:
        engine.dispose()


def test_received_at_revision_fills_existing_jobs_and_keeps_their_events(new_database):
    import datetime as dt

    from sqlalchemy import select
    from sqlalchemy import text

    from collector.models import Job

    url = new_database()
    migrations.upgrade(url, "0005")
    engine = create_engine(url, poolclass=NullPool)
    stamped = dt.datetime(2026, 12, 1, 8, 30, 15, 250000, tzinfo=dt.UTC)
    try:
        with engine.begin() as conn:
            # Raw SQL: the model already has the column this revision adds.
            conn.execute(text(
                "INSERT INTO jobs (cluster, job_id, job_name, is_placeholder, status, submitted_at, updated_at)"
                " VALUES ('a', '7', 'n', false, 'workers', :at, :at)"), {"at": stamped})
            pk = conn.execute(text("SELECT id FROM jobs")).scalar_one()
            conn.execute(text("INSERT INTO job_events (job_pk, status, created_at) VALUES (:pk, 'workers', :at)"),
                         {"pk": pk, "at": stamped})
        migrations.upgrade(url)
        with engine.connect() as conn:
            (received,) = conn.execute(select(Job.received_at)).one()
            events = conn.execute(text("SELECT count(*) FROM job_events")).scalar_one()
        # The best guess for rows from before the column: the reporter's newest stamp.
        assert (received, events) == (stamped, 1)
        migrations.downgrade(url, "0005")
        assert "received_at" not in {c["name"] for c in inspect(engine).get_columns("jobs")}
    finally:
        engine.dispose()
