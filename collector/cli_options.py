"""Options and helpers the command groups share (`collector db`, `collector token`, `collector prune`)."""

from __future__ import annotations

import click

from collector.settings import Settings
from collector.settings import database_url

db_option = click.option("--db", "db", default=None,
                         help="SQLite file path or SQLAlchemy URL (default from COLLECTOR_DATABASE_URL).")


def database_url_of(db: str | None) -> str:
    """The database a command works on: ``--db``, else the environment the app reads."""
    # `flask --app collector db ...` lands here too, without building the app (whose
    # serving checks, such as tokens, do not apply).
    return database_url(db) if db else Settings.from_env().database_url


def redacted(url: str) -> str:
    """``url`` with its password hidden, for output and logs."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def echo_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    """Print ``rows`` under ``header`` in left-aligned columns, as kubectl and gh list things."""
    table = [header, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
