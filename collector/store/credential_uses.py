"""When each named credential was last used: written by the serving processes, read by ``collector token list``."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import Connection
from sqlalchemy import func
from sqlalchemy import select

from collector.models import CredentialUse
from collector.store.core import table
from collector.store.core import upsert

USES = table(CredentialUse)


def record(conn: Connection, uses: dict[str, dt.datetime]) -> None:
    """Note that each credential in ``uses`` was used at its time; a newer time already stored wins."""
    if not uses:
        return
    rows = [{"name": name, "last_used_at": at} for name, at in sorted(uses.items())]
    # Several processes write; none may move a credential's time backwards.
    newest = func.max if conn.dialect.name == "sqlite" else func.greatest
    upsert(conn, USES, rows, ["name"],
           {"last_used_at": lambda excluded: newest(USES.c.last_used_at, excluded.last_used_at)})


def last_used(conn: Connection) -> dict[str, dt.datetime]:
    """Every credential's last use that was written down, by name."""
    return {row.name: row.last_used_at for row in conn.execute(select(USES.c.name, USES.c.last_used_at))}
