"""collector: the shared job-status collector for srtctl (Status API v1)."""

from collector.app import create_app

__all__ = ["create_app"]
