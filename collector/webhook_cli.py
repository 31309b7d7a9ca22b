"""``collector webhook``: add, list and remove webhook subscriptions, straight in the database."""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Callable
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar

import click
from sqlalchemy import Connection

from collector.cli_options import database_url_of
from collector.cli_options import db_option
from collector.cli_options import echo_table
from collector.cli_options import redacted

T = TypeVar("T")


@click.group("webhook")
def webhook_group() -> None:
    """Subscribe URLs to job events (the same as POST/GET/DELETE /api/webhooks)."""


@contextmanager
def _connection(db: str | None) -> Iterator[Connection]:
    from sqlalchemy import create_engine
    from sqlalchemy import inspect
    from sqlalchemy.pool import NullPool

    url = database_url_of(db)
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.begin() as conn:
            if not inspect(conn).has_table("webhooks"):
                raise click.ClickException(f"database {redacted(url)} has no webhooks table: "
                                           "run `collector db upgrade` first")
            yield conn
    finally:
        engine.dispose()


def _run(db: str | None, work: Callable[[Connection], T]) -> T:
    from collector.store.errors import NotFound

    try:
        with _connection(db) as conn:
            return work(conn)
    except NotFound as exc:
        raise click.ClickException(str(exc)) from None


@webhook_group.command("add")
@click.argument("url")
@click.option("--status", "statuses", multiple=True, metavar="S",
              help="A job status to hear about (repeatable; default: completed, failed, timeout).")
@click.option("--cluster", "clusters", multiple=True, metavar="C",
              help="A cluster to hear about (repeatable; default: every cluster).")
@click.option("--secret-env", metavar="VAR", default=None,
              help="Variable holding the secret that signs each delivery (never pass a secret as an argument).")
@click.option("--format", "body_format", type=click.Choice(["json", "slack"]), default="json", show_default=True,
              help="The collector's JSON, or a Slack incoming-webhook message.")
@db_option
def webhook_add(url: str, statuses: tuple[str, ...], clusters: tuple[str, ...], secret_env: str | None,
                body_format: str, db: str | None) -> None:
    """Subscribe URL to job events; prints the subscription as JSON."""
    from pydantic import ValidationError

    from collector.errors import validation_detail
    from collector.store import webhooks
    from collector.webhook_contract import WebhookCreate

    fields: dict[str, object] = {"url": url, "clusters": list(clusters), "format": body_format}
    if statuses:
        fields["statuses"] = list(statuses)
    if secret_env is not None:
        secret = os.environ.get(secret_env)
        if not secret:
            raise click.ClickException(f"{secret_env} is not set or empty: export the webhook's secret in it")
        fields["secret"] = secret
    try:
        subscription = WebhookCreate.model_validate(fields)
    except ValidationError as exc:
        raise click.ClickException(validation_detail(exc, "webhook")[0]) from None
    created = _run(db, lambda conn: webhooks.add(conn, subscription, dt.datetime.now(dt.UTC)))
    click.echo(created.model_dump_json(indent=2))


@webhook_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of objects instead of a table.")
@db_option
def webhook_list(as_json: bool, db: str | None) -> None:
    """List the subscriptions, oldest first (never a secret)."""
    from collector.store import webhooks

    found = _run(db, webhooks.all_of)
    if as_json:
        click.echo(json.dumps([hook.model_dump(mode="json") for hook in found], indent=2))
        return
    echo_table(("ID", "URL", "STATUSES", "CLUSTERS", "FORMAT", "SIGNED", "ENABLED"), [
        (str(hook.id), hook.url, ",".join(s.value for s in hook.statuses), ",".join(hook.clusters) or "*",
         hook.format.value, "yes" if hook.signed else "no",
         "yes" if hook.enabled else f"no ({hook.disabled_reason})" if hook.disabled_reason else "no")
        for hook in found
    ])


@webhook_group.command("remove")
@click.argument("webhook_id", type=click.IntRange(min=1), metavar="ID")
@db_option
def webhook_remove(webhook_id: int, db: str | None) -> None:
    """Remove subscription ID."""
    from collector.store import webhooks

    gone = _run(db, lambda conn: webhooks.remove(conn, webhook_id))
    click.echo(f"webhook {gone.id} removed ({gone.url})")
