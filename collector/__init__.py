"""collector: the shared job-status collector for srtctl (Status API v1)."""

from __future__ import annotations

__all__ = ["create_app"]


def __getattr__(name: str):
    # Lazy: `flask --app collector` finds create_app here, while a batch job importing
    # collector.reporter does not pay for Flask and SQLAlchemy.
    if name == "create_app":
        from collector.app import create_app

        return create_app
    raise AttributeError(f"module 'collector' has no attribute {name!r}")
