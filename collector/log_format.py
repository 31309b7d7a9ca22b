"""How log lines look: plain text, or one JSON object per line carrying the request id."""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
from urllib.parse import parse_qsl
from urllib.parse import urlencode

from flask import g
from flask import has_request_context

# `collector serve`'s text line; gunicorn's (deploy/gunicorn.conf.py) adds the pid.
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Query parameters whose value is a credential. The collector reads tokens only from
# the Authorization header, but a client may still put one in the URL, and the access
# line logs the query string.
SECRET_PARAM = re.compile(r"token|auth|key|secret|passw|signature|credential", re.IGNORECASE)
REDACTED = "REDACTED"
# A record's own attributes; anything else on it came from ``extra=`` and becomes a key.
_RECORD_FIELDS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "request_id", "taskName"}


def redact_query(query: str) -> str:
    """``query`` with the value of every credential-like parameter replaced."""
    if not query:
        return ""
    pairs = parse_qsl(query, keep_blank_values=True)
    if not any(SECRET_PARAM.search(name) for name, _ in pairs):
        return query  # logged exactly as sent
    return urlencode([(name, REDACTED if SECRET_PARAM.search(name) else value) for name, value in pairs])


class RequestIdFilter(logging.Filter):
    """Stamp every record with the id of the request being handled, None outside a request."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = g.get("request_id") if has_request_context() else None
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, message, request_id, pid and the record's extras."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", None),
            "pid": record.process,
        }
        for name, value in vars(record).items():
            if name not in _RECORD_FIELDS and not name.startswith("_"):
                entry[name] = value
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exc_info"] = record.exc_text
        if record.stack_info:
            entry["stack_info"] = self.formatStack(record.stack_info)
        # ASCII only: a U+2028 in a message must not split the line for a log shipper.
        return json.dumps(entry, default=str)


def formatter(log_format: str, text_format: str = TEXT_FORMAT) -> logging.Formatter:
    """The formatter for COLLECTOR_LOG_FORMAT (``json``; anything else is text)."""
    return JsonFormatter() if log_format == "json" else logging.Formatter(text_format)


def configure(log_format: str, level: int = logging.INFO) -> None:
    """Send every log line of this process to stderr in ``log_format`` (for `collector serve`)."""
    handler = logging.StreamHandler()
    handler.setFormatter(formatter(log_format))
    handler.addFilter(RequestIdFilter())
    logging.basicConfig(level=level, handlers=[handler])
    if log_format == "json":
        # A Python warning would otherwise print two plain lines on stderr.
        logging.captureWarnings(True)
