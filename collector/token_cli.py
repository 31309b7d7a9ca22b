"""``collector token``: add, remove and list the named credentials of the tokens file (collector/credentials.py)."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any
from typing import cast

import click

from collector.cli_options import database_url_of
from collector.cli_options import db_option
from collector.cli_options import echo_table

TOKENS_FILE_ENV = "COLLECTOR_TOKENS_FILE"
tokens_file_option = click.option("--file", "path", type=click.Path(dir_okay=False, path_type=Path), default=None,
                                  help=f"The tokens file (default ${TOKENS_FILE_ENV}).")


def _tokens_path(path: Path | None) -> Path:
    # The file the server reads: the same variable, made absolute the same way (Settings.from_env).
    value = path or os.environ.get(TOKENS_FILE_ENV)
    if not value:
        raise click.UsageError(f"no tokens file: pass --file PATH or set {TOKENS_FILE_ENV}")
    return Path(value).expanduser().absolute()


@click.group("token")
def token_group() -> None:
    """Add, remove and list the named credentials of the tokens file."""


@token_group.command("add")
@click.argument("name")
# collector.credentials.ROLES, not imported: `collector` loads no pydantic until a command needs it.
@click.option("--role", type=click.Choice(["read", "write", "admin"]), required=True,
              help="read: GET only; write: also POST and PUT; admin: also DELETE.")
@click.option("--cluster", "clusters", multiple=True, metavar="C",
              help="Limit a write credential to cluster C; repeatable (default: every cluster).")
@tokens_file_option
def token_add(name: str, role: str, clusters: tuple[str, ...], path: Path | None) -> None:
    """Add credential NAME; its secret is printed once, on the last line."""
    from collector import credentials

    path = _tokens_path(path)
    try:
        secret = credentials.add(path, name, cast("credentials.Role", role), clusters)
    except credentials.CredentialsError as exc:
        raise click.ClickException(str(exc)) from None
    scope = f" for cluster{'s' if len(clusters) > 1 else ''} {', '.join(clusters)}" if clusters else ""
    click.echo(f"added {role} credential {name!r}{scope} to {path}; every collector reading it accepts it now")
    if role == "write":
        click.echo("where srtctl runs: export SRTCTL_STATUS_TOKEN=<secret>; the secret, shown only this once:")
    else:
        click.echo("clients send it as `Authorization: Bearer <secret>`; the secret, shown only this once:")
    click.echo(secret)


@token_group.command("remove")
@click.argument("name")
@tokens_file_option
def token_remove(name: str, path: Path | None) -> None:
    """Remove credential NAME; collectors refuse it within a second."""
    from collector import credentials

    path = _tokens_path(path)
    try:
        credentials.remove(path, name)
    except credentials.CredentialsError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"removed credential {name!r} from {path}")


@token_group.command("list")
@tokens_file_option
@db_option
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of objects instead of a table.")
def token_list(path: Path | None, db: str | None, as_json: bool) -> None:
    """List name, role, clusters, created and last use (never a secret)."""
    from collector import credentials
    from collector.contract import format_timestamp

    path = _tokens_path(path)
    try:
        tokens, _ = credentials.read_file(path)
    except credentials.CredentialsError as exc:
        raise click.ClickException(str(exc)) from None
    uses = _last_uses(db)
    rows: list[dict[str, Any]] = []
    for entry in tokens.tokens:
        used = uses.get(entry.name) if uses is not None else None
        rows.append({
            "name": entry.name,
            "role": entry.role,
            "clusters": list(entry.clusters),  # empty: every cluster
            "created": format_timestamp(entry.created_at),
            # A time, "never" (no use written down), or "unknown" (the database could not tell).
            "last_used": "unknown" if uses is None else format_timestamp(used) if used else "never",
        })
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    echo_table(("NAME", "ROLE", "CLUSTERS", "CREATED", "LAST USED"),
               [(r["name"], r["role"], ",".join(r["clusters"]) or "*", r["created"], r["last_used"]) for r in rows])


def _last_uses(db: str | None) -> dict[str, dt.datetime] | None:
    """Each credential's last use written down in the database, or None (and a warning) when it cannot tell."""
    from sqlalchemy import create_engine
    from sqlalchemy import inspect
    from sqlalchemy.engine import make_url
    from sqlalchemy.pool import NullPool

    from collector.store import credential_uses

    shown = "(unknown)"
    try:
        url = make_url(database_url_of(db))
        shown = url.render_as_string(hide_password=True)
        if url.get_backend_name() == "sqlite" and url.database and not Path(url.database).exists():
            # Connecting would create an empty file where the collector keeps its data.
            click.echo(f"warning: last used unknown: database {shown} does not exist", err=True)
            return None
        # A database that does not answer must not hold the listing up for long.
        connect_args = {"connect_timeout": 5} if url.get_backend_name() == "postgresql" else {}
        engine = create_engine(url, poolclass=NullPool, connect_args=connect_args)
        try:
            with engine.connect() as conn:
                if not inspect(conn).has_table(credential_uses.USES.name):
                    click.echo(f"warning: last used unknown: database {shown} is not migrated "
                               "(run `collector db upgrade`)", err=True)
                    return None
                return credential_uses.last_used(conn)
        finally:
            engine.dispose()
    except Exception as exc:  # noqa: BLE001 - the listing is what was asked for; last use is extra
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        click.echo(f"warning: last used unknown: cannot read database {shown}: {reason}", err=True)
        return None


