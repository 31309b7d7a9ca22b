"""What every store module shares: the models' tables typed as tables, and the unit-of-work runner."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from typing import Protocol
from typing import TypeVar

from sqlalchemy import Connection
from sqlalchemy import Table
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from collector.models import Base

T = TypeVar("T")


def table(model: type[Base]) -> Table:
    """``model``'s Table (declarative types ``__table__`` as any FromClause)."""
    found = model.__table__
    assert isinstance(found, Table), f"{model.__name__} is not mapped to a table"
    return found


def upsert(conn: Connection, table: Table, rows: list[dict[str, Any]], keys: list[str],
           update: dict[str, Any]) -> None:
    """Insert ``rows``, or on a conflict over ``keys`` set ``update`` (a value, or a function of the excluded row)."""
    insert = (pg_insert if conn.dialect.name == "postgresql" else sqlite_insert)(table)
    values = {name: (value(insert.excluded) if callable(value) else value) for name, value in update.items()}
    conn.execute(insert.on_conflict_do_update(index_elements=keys, set_=values), rows)


class Run(Protocol):
    """Runs ``work`` in one committed transaction and returns what it returned (``Database.run``).

    Store functions that need several short transactions (a download, a prune, a
    checksum outside the upload's) take one of these instead of a connection.
    """

    def __call__(self, work: Callable[[Connection], T], *, write: bool = ...) -> T: ...
