"""The store's own errors: what went wrong in domain terms, with the data a caller needs.

The store knows nothing of HTTP; ``collector.errors`` maps each class to a status and
answers with ``detail`` plus ``data`` as the JSON error body.
"""

from __future__ import annotations

from typing import Any


class StoreError(Exception):
    """A request the store cannot carry out: ``detail`` says why, ``data`` holds the specifics."""

    def __init__(self, detail: str, **data: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.data: dict[str, Any] = data


class NotFound(StoreError):
    """The job, file or segment named does not exist (or is not complete yet)."""


class Conflict(StoreError):
    """The request disagrees with what is stored (an ambiguous job id, bytes that differ)."""


class Unprocessable(StoreError):
    """The request is well formed but cannot be stored as asked (an offset past the limit)."""
