"""collector: the shared job-status collector for srtctl (Status API v1)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # What __getattr__ hands out, for the type checker (at run time it is imported lazily).
    from collector.app import create_app as create_app

__all__ = ["create_app"]


def __getattr__(name: str) -> object:
    # Lazy: `flask --app collector` finds create_app here, while a batch job importing
    # collector.reporter does not pay for Flask and SQLAlchemy.
    if name == "create_app":
        from collector.app import create_app

        return create_app
    raise AttributeError(f"module 'collector' has no attribute {name!r}")
