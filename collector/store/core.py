"""What every store module shares: the models' tables typed as tables, and the unit-of-work runner."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol
from typing import TypeVar

from sqlalchemy import Connection
from sqlalchemy import Table

from collector.models import Base

T = TypeVar("T")


def table(model: type[Base]) -> Table:
    """``model``'s Table (declarative types ``__table__`` as any FromClause)."""
    found = model.__table__
    assert isinstance(found, Table), f"{model.__name__} is not mapped to a table"
    return found


class Run(Protocol):
    """Runs ``work`` in one committed transaction and returns what it returned (``Database.run``).

    Store functions that need several short transactions (a download, a prune, a
    checksum outside the upload's) take one of these instead of a connection.
    """

    def __call__(self, work: Callable[[Connection], T], *, write: bool = ...) -> T: ...
