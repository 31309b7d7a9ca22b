"""The ``collector`` command: ``serve``, ``prune``, ``token``, ``webhook``, ``db`` (``db`` also under
``flask``), the batch-job commands (``report``, ``stream-logs``, ``wrap``) and the readers
(``jobs``, ``show``, ``logs``, ``events``).

Subcommands that live in other modules load only when run, so ``collector jobs`` on a
login node never imports the server's packages.
"""

from __future__ import annotations

import datetime as dt
import importlib
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any
from typing import cast

import click

from collector.cli_options import database_url_of
from collector.cli_options import db_option
from collector.cli_options import redacted
from collector.settings import Settings
from collector.settings import SettingsError

if TYPE_CHECKING:
    from collector.probe import ProbeThread
    from collector.serving import GunicornArbiter

log = logging.getLogger("collector")


class LazyGroup(click.Group):
    """A group whose other modules' subcommands are imported only when named (click's lazy loading recipe)."""

    def __init__(self, *args: Any, lazy: dict[str, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = lazy  # name -> "module:attribute"

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ModuleNotFoundError as exc:
            # A client-only install (`pip install collector`) running a server command.
            if (exc.name or "").partition(".")[0] not in SERVER_PACKAGES:
                raise
            raise click.ClickException(f"this command needs the collector's server packages ({exc.name} is not "
                                       "installed): pip install 'collector[server]'") from None

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy and cmd_name not in self.commands:
            module, _, attribute = self.lazy[cmd_name].partition(":")
            self.add_command(getattr(importlib.import_module(module), attribute), cmd_name)
        return super().get_command(ctx, cmd_name)


# What `pip install "collector[server]"` adds to the client side (pyproject.toml).
SERVER_PACKAGES = frozenset({"flask", "werkzeug", "sqlalchemy", "psycopg", "alembic", "pydantic", "pydantic_core",
                             "gunicorn", "prometheus_client"})
LAZY = {
    "token": "collector.token_cli:token_group",
    "webhook": "collector.webhook_cli:webhook_group",
    "probe": "collector.probe:probe",
    # Inside batch jobs (collector/reporter).
    "report": "collector.reporter.cli:report",
    "stream-logs": "collector.reporter.cli:stream_logs",
    "wrap": "collector.reporter.cli:wrap",
    # For people in terminals (collector/reader).
    "jobs": "collector.reader.cli:jobs",
    "show": "collector.reader.cli:show",
    "logs": "collector.reader.cli:logs",
    "events": "collector.reader.cli:events",
    "watch": "collector.reader.cli:watch",
}


@click.group(cls=LazyGroup, lazy=LAZY)
def main() -> None:
    """The shared job-status collector for srtctl."""


@main.command()
@click.option("--host", default=None, help="Address to bind (default 127.0.0.1, loopback only).")
@click.option("--port", type=int, default=None, help="Port to bind (default 8080; 0 picks a free one).")
@click.option("--db", "db", default=None, help="SQLite file path or SQLAlchemy URL.")
@click.option("--token-env", default=None, help="Variable holding the write token (default SRTCTL_STATUS_TOKEN).")
@click.option("--read-token-env", default=None,
              help="Variable holding the read token (default SRTCTL_STATUS_READ_TOKEN).")
@click.option("--tokens-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Tokens file of named credentials (default COLLECTOR_TOKENS_FILE; see `collector token`).")
@click.option("--allow-unauthenticated", is_flag=True, default=None, help="Serve without a token off loopback.")
@click.option("--cors-origin", "cors_origins", multiple=True,
              help="Origin allowed to read from a browser; repeatable; '*' for any.")
@click.option("--probe-cluster", default=None, metavar="NAME",
              help="Also probe Slurm cluster NAME from this host (sinfo/squeue), as `collector probe` would.")
@click.option("--probe-interval", type=click.FloatRange(min=1), default=30.0, show_default=True,
              help="Seconds between probes of --probe-cluster.")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="gunicorn worker processes (default: 1 on SQLite, 2 x CPUs on PostgreSQL).")
def serve(host: str | None, port: int | None, db: str | None, token_env: str | None, read_token_env: str | None,
          tokens_file: Path | None, allow_unauthenticated: bool | None, cors_origins: tuple[str, ...],
          probe_cluster: str | None, probe_interval: float, workers: int | None) -> None:
    """Serve the collector with gunicorn, as deployments do (one worker on SQLite by default)."""
    from collector import serving

    # Before collector.app imports prometheus_client: workers share their metrics through files.
    serving.use_metrics_dir()
    from collector import log_format
    from collector.app import create_app
    from collector.app import prepare_to_serve
    from collector.credentials import check_file
    from collector.db import get_db_of

    try:
        settings = Settings.from_env(
            host=host,
            port=port,
            database_url=db,
            token_env=token_env,
            read_token_env=read_token_env,
            tokens_file=tokens_file,
            allow_unauthenticated=allow_unauthenticated,
            cors_origins=cors_origins or None,
            workers=workers,
        )
        # Before gunicorn configures logging, so a refusal below is in the chosen format
        # too; an unknown format logs as text until check() refuses it.
        log_format.configure(settings.log_format)
        if probe_cluster and settings.requires_token and not settings.write_token:
            # The in-process probe reports over HTTP with the spec's write token, and a
            # tokens file holds no secret it could use instead.
            raise SettingsError(
                f"--probe-cluster reports with the write token ${settings.token_env}, which is not set: set it, "
                f"or run `collector probe --cluster {probe_cluster}` on its own with a write credential of "
                f"that cluster (`collector token add NAME --role write --cluster {probe_cluster}`)"
            )
        # Checked and migrated once, here; the workers build their own apps after the fork.
        app = create_app(settings)
        prepare_to_serve(app)
        get_db_of(app).dispose()
        credentials = check_file(settings)
        auth = _auth_summary(settings, credentials)
    except SettingsError as exc:
        raise click.ClickException(str(exc)) from None
    probes: list[ProbeThread] = []

    def ready(server: GunicornArbiter) -> None:
        port = serving.listening_port(server)
        log.info("collector listening on http://%s:%d (%s, %s)", settings.host, port,
                 redacted(settings.database_url), auth)
        if probe_cluster:
            # In the master, so one probe runs however many workers serve.
            probes.append(_start_probe(probe_cluster, probe_interval, port, settings))

    def stopped() -> None:
        for probe in probes:
            probe.stop()
        log.info("collector stopped")

    serving.CollectorServer(settings, when_ready=ready, on_stop=stopped).run()


def _auth_summary(settings: Settings, count: int) -> str:
    """How the server checks requests, for its startup line (never a secret); ``count`` credentials in the file."""
    spec_tokens = " and ".join(f"${name}" for name, value in ((settings.token_env, settings.write_token),
                                                               (settings.read_token_env, settings.read_token))
                               if value)
    if settings.tokens_file is None:
        return "token required" if settings.write_token else "no token (open)"
    summary = f"tokens file {settings.tokens_file} ({count} credential{'' if count == 1 else 's'})"
    return f"{summary} and {spec_tokens}" if spec_tokens else summary


def _start_probe(cluster: str, interval: float, port: int, settings: Settings) -> ProbeThread:
    from collector.probe import start_in_process

    # The probe talks to this very server, with its write token: over loopback when the
    # server listens on every address, else on the one address it listens on.
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(settings.host, settings.host)
    url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    log.info("probing Slurm cluster %s every %g s", cluster, interval)
    return start_in_process(cluster, url, settings.write_token, interval_s=interval)


@click.group("db")
def db_group() -> None:
    """Migrate and inspect the database schema."""


@db_group.command()
@db_option
@click.option("--revision", default="head", show_default=True, help="Target revision.")
def upgrade(db: str | None, revision: str) -> None:
    """Upgrade the schema to the newest revision (or --revision)."""
    from collector import migrations

    url = database_url_of(db)
    _ensure_sqlite_dir(url)
    migrations.upgrade(url, revision)
    click.echo(f"database {redacted(url)} is at {revision}")


@db_group.command(context_settings={"ignore_unknown_options": True})
@db_option
@click.argument("revision")
def downgrade(db: str | None, revision: str) -> None:
    """Downgrade the schema to REVISION (e.g. -1, or base)."""
    from collector import migrations

    url = database_url_of(db)
    migrations.downgrade(url, revision)
    click.echo(f"database {redacted(url)} downgraded to {revision}")


@db_group.command()
@db_option
def current(db: str | None) -> None:
    """Print the schema revision of the database and the one this code needs."""
    from sqlalchemy import create_engine

    from collector import migrations

    engine = create_engine(database_url_of(db))
    try:
        revision = migrations.current_revision(engine)
    finally:
        engine.dispose()
    head = migrations.head_revision()
    state = "up to date" if revision == head else f"behind: run `collector db upgrade` to reach {head}"
    click.echo(f"{revision or '(none)'} ({state})")


@db_group.command()
@db_option
def recount(db: str | None) -> None:
    """Rebuild the per-cluster, per-status job counts from the jobs table."""
    from sqlalchemy import create_engine

    from collector.store import counts

    engine = create_engine(database_url_of(db))
    try:
        with engine.begin() as conn:
            counts.recount(conn)
    finally:
        engine.dispose()
    click.echo("job counts rebuilt")


@db_group.command("grant-readonly")
@db_option
@click.option("--password-env", metavar="VAR", default=None,
              help="Variable holding the role's password (needed to create the role; omit to only re-grant).")
@click.argument("role")
def grant_readonly(db: str | None, password_env: str | None, role: str) -> None:
    """Create or update LOGIN role ROLE that can read only the collector_api views (PostgreSQL)."""

    import psycopg
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    from collector import grants

    problem = grants.role_name_problem(role)
    if problem:
        raise click.BadParameter(problem, param_hint="ROLE")
    url = database_url_of(db)
    if make_url(url).get_backend_name() != "postgresql":
        raise click.ClickException("grant-readonly needs PostgreSQL: SQLite has no roles and no collector_api "
                                   "views (dashboards read PostgreSQL only)")
    password = None
    if password_env:
        # Read from the environment, never argv: a command line is visible to every local user.
        password = os.environ.get(password_env)
        if not password:
            raise click.ClickException(f"{password_env} is not set or empty: export the role's password in it")
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            # The URL is PostgreSQL's, whose driver here is psycopg.
            driver = cast(psycopg.Connection, conn.connection.driver_connection)
            outcome = grants.grant_readonly(driver, role, password)
    except grants.GrantError as exc:
        raise click.ClickException(str(exc)) from None
    except psycopg.Error as exc:
        raise click.ClickException(f"PostgreSQL refused: {exc.diag.message_primary or exc}") from None
    finally:
        engine.dispose()
    click.echo(f"role {role} {outcome}: it can read the {grants.API_SCHEMA} views of {redacted(url)}")


@main.command()
@click.option("--older-than", "days", type=click.FloatRange(min=0), required=True, metavar="DAYS",
              help="Prune jobs finished (last updated) more than DAYS days ago.")
@click.option("--cluster", default=None, help="Only jobs of this cluster.")
@click.option("--status", type=click.Choice(["completed", "failed"]), default=None,
              help="Only jobs in this status (default: both finished statuses).")
@click.option("--logs-only", is_flag=True, help="Keep the jobs and their events; delete only logs and captures.")
@click.option("--dry-run", is_flag=True, help="Print what would be removed and remove nothing.")
@click.option("--batch-size", type=click.IntRange(min=1), default=200, show_default=True,
              help="Jobs per transaction; writers get the database between batches.")
@db_option
def prune(days: float, cluster: str | None, status: str | None, logs_only: bool, dry_run: bool, batch_size: int,
          db: str | None) -> None:
    """Delete finished jobs (or only their logs and captures) older than a cutoff."""

    from collector.db import Database
    from collector.store import retention

    selection = retention.Selection(
        cutoff=dt.datetime.now(dt.UTC) - dt.timedelta(days=days),
        cluster=cluster,
        statuses=(status,) if status else retention.FINISHED,
        logs_only=logs_only,
    )
    database = Database(Settings.from_env(database_url=database_url_of(db)))
    try:
        pruned = retention.prune(database.run, selection, dry_run=dry_run, batch_size=batch_size)
    finally:
        database.dispose()
    verb = "would remove" if dry_run else "removed"
    blobs = f"{pruned.files} log/capture files ({pruned.bytes} bytes)"
    if logs_only:
        click.echo(f"{verb} {blobs} of {pruned.jobs} jobs finished before {selection.cutoff.isoformat()}")
    else:
        click.echo(f"{verb} {pruned.jobs} jobs finished before {selection.cutoff.isoformat()}, with {blobs}")


@main.command()
def openapi() -> None:
    """Print the OpenAPI document (docs/openapi.json is this output)."""

    from collector.app import create_app
    from collector.openapi import document

    # Building the app reads settings but opens no connection; the document needs neither.
    click.echo(json.dumps(document(create_app(Settings(database_url="sqlite://"))), indent=2))


def _ensure_sqlite_dir(url: str) -> None:
    from collector.db import ensure_sqlite_parent

    ensure_sqlite_parent(url)


main.add_command(db_group)
