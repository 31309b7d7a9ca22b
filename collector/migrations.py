"""Alembic wiring: where the revisions live, upgrading, and comparing the schema to the code."""

from __future__ import annotations

import functools
import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import Connection
from sqlalchemy import Engine
from sqlalchemy import create_engine
from sqlalchemy import inspect
from sqlalchemy import text

from collector.store import event_ids

PACKAGE_DIR = Path(__file__).resolve().parent
log = logging.getLogger("collector.migrations")


def script_location() -> Path:
    """The revisions: inside the package when installed from a wheel, else the checkout's."""
    packaged = PACKAGE_DIR / "_alembic"
    return packaged if packaged.is_dir() else PACKAGE_DIR.parent / "alembic"


def alembic_config(url: str) -> Config:
    """An Alembic config for ``url`` that needs no alembic.ini."""
    config = Config()
    config.set_main_option("script_location", str(script_location()))
    # ConfigParser interpolation would eat a literal % in a password.
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


@functools.cache
def head_revision() -> str:
    """The revision this code expects."""
    heads = ScriptDirectory.from_config(alembic_config("sqlite://")).get_heads()
    if len(heads) != 1:
        raise RuntimeError(f"migrations have {len(heads)} heads: {heads}")
    return heads[0]


def revision_of(connection: Connection) -> str | None:
    """The revision the database on ``connection`` is at (None when it was never migrated)."""
    # Plain SQL rather than MigrationContext, which logs at INFO on every call (every probe).
    if not inspect(connection).has_table("alembic_version"):
        return None
    revision: str | None = connection.execute(text("SELECT version_num FROM alembic_version")).scalar()
    return revision


def current_revision(engine: Engine) -> str | None:
    """The revision the database behind ``engine`` is at (None when it was never migrated)."""
    with engine.connect() as connection:
        return revision_of(connection)


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate the database at ``url`` to ``revision``, then put new event ids above stored ones."""
    command.upgrade(alembic_config(url), revision)
    engine = create_engine(url)
    try:
        settle_event_ids(engine)
    finally:
        engine.dispose()


def settle_event_ids(engine: Engine) -> int | None:
    """Raise PostgreSQL's event id shift when stored ids are not below new ones (event_ids.settle).

    Returns the new shift, or None when nothing needed raising (always on SQLite).
    """
    with engine.begin() as conn:
        if not inspect(conn).has_table("event_id_shift"):
            return None
        shift = event_ids.settle(conn)
    if shift is not None:
        log.warning("stored event ids were not below new ones (a restore into a new PostgreSQL cluster?): "
                    "new event ids now start above them (event_id_shift %d)", shift)
    return shift


def downgrade(url: str, revision: str) -> None:
    """Migrate the database at ``url`` back to ``revision``."""
    command.downgrade(alembic_config(url), revision)


@functools.cache
def known_revisions() -> frozenset[str]:
    """Every revision this code ships."""
    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    return frozenset(r.revision for r in script.walk_revisions())


def is_behind(current: str | None) -> bool:
    """Whether a database at ``current`` lacks revisions this code needs.

    A revision this code does not know is a newer one: the upgrade ran before this
    process was replaced, and every revision works with the code before it, so the
    database can still serve (the rule in docs/operations.md).
    """
    return current is None or (current != head_revision() and current in known_revisions())


def schema_problem(engine: Engine) -> str | None:
    """Why the database cannot serve this code, or None when it is at head (or newer)."""
    current = current_revision(engine)
    if not is_behind(current):
        return None
    at = f"at revision {current}" if current else "not migrated"
    return f"database schema is {at} but this code needs {head_revision()}: run `collector db upgrade`"
