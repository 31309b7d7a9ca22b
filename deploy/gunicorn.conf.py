"""gunicorn settings for a shared collector, driven by ``COLLECTOR_*`` environment variables.

    gunicorn -c deploy/gunicorn.conf.py collector.wsgi:app

Every value comes from collector/serving.py, the same code `collector serve` runs
gunicorn with, from the same settings object (docs/operations.md lists the variables).
The bind address comes from COLLECTOR_HOST / COLLECTOR_PORT, the same variables the app
checks its auth rules against (no token is only allowed on loopback).
"""

import logging

from collector import serving

# Before anything imports prometheus_client (collector.settings does not): it picks its
# multiprocess mode at import, from the directory this sets.
serving.use_metrics_dir()

from collector.settings import Settings  # noqa: E402 - after the metrics directory is chosen

_settings = Settings.from_env()
globals().update(serving.options(_settings))

if _settings.log_format == "json":
    # A Python warning would otherwise print two plain lines among the JSON ones.
    logging.captureWarnings(True)
