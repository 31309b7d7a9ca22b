"""Webhook subscriptions: add, list and remove them (the delivery side reads them too)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import Connection
from sqlalchemy import delete
from sqlalchemy import insert
from sqlalchemy import select

from collector.models import Webhook as WebhookModel
from collector.store import streams
from collector.store.core import table
from collector.store.errors import NotFound
from collector.webhook_contract import Webhook
from collector.webhook_contract import WebhookCreate

WEBHOOKS = table(WebhookModel)
MAX_ID = 2**31 - 1  # an INTEGER primary key


def _shown(row: Any) -> Webhook:
    return Webhook(id=row.id, url=row.url, statuses=row.statuses, clusters=row.clusters, format=row.format,
                   signed=row.secret is not None, enabled=row.enabled, disabled_reason=row.disabled_reason,
                   created_at=row.created_at, created_by=row.created_by)


def add(conn: Connection, subscription: WebhookCreate, now: dt.datetime, *, created_by: str | None = None) -> Webhook:
    """Store a subscription; it hears of events appended from now on."""
    head = streams.newest_id(conn)
    row = conn.execute(insert(WEBHOOKS).returning(*WEBHOOKS.c), {
        "url": subscription.url, "statuses": [s.value for s in subscription.statuses],
        "clusters": subscription.clusters, "secret": subscription.secret, "format": subscription.format.value,
        "enabled": True, "start_after": head, "created_at": now, "created_by": created_by,
    }).one()
    return _shown(row)




def all_of(conn: Connection) -> list[Webhook]:
    """Every subscription, oldest first."""
    return [_shown(row) for row in conn.execute(select(WEBHOOKS).order_by(WEBHOOKS.c.id))]


def remove(conn: Connection, webhook_id: int) -> Webhook:
    """Delete a subscription and return it as it was; 404 when there is none with that id."""
    # Past the column's range there is no such row (and PostgreSQL would refuse the comparison).
    row = None if webhook_id > MAX_ID else conn.execute(
        delete(WEBHOOKS).where(WEBHOOKS.c.id == webhook_id).returning(*WEBHOOKS.c)).first()
    if row is None:
        raise NotFound(f"no webhook {webhook_id}")
    return _shown(row)
