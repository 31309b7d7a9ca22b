"""``/api/webhooks``: subscribe URLs to job events, list and remove the subscriptions (admins only)."""

from __future__ import annotations

import datetime as dt

from flask import Blueprint
from flask import Response

from collector.api import admin
from collector.api import parse_body
from collector.api import respond
from collector.db import transaction
from collector.openapi import JSON
from collector.openapi import operation
from collector.store import webhooks as webhook_store
from collector.webhook_contract import Webhook
from collector.webhook_contract import WebhookCreate
from collector.webhook_contract import WebhookList

bp = Blueprint("webhooks", __name__, url_prefix="/api/webhooks")
# A subscription names a URL the collector will call: only admins choose those (and see
# them: a Slack webhook's URL is itself a secret).
WHAT = "webhooks"


@bp.post("")
@operation(body={JSON: WebhookCreate}, responses={201: Webhook}, errors=(403,))
def add_webhook() -> Response:
    """Subscribe a URL to job events of the given statuses (default: finished) and clusters (default: all)."""
    created_by = admin(WHAT)
    subscription = parse_body(WebhookCreate)
    now = dt.datetime.now(dt.UTC)
    return respond(transaction(lambda conn: webhook_store.add(conn, subscription, now, created_by=created_by),
                               write=True), 201)


@bp.get("")
@operation(responses={200: WebhookList}, errors=(403,))
def list_webhooks() -> Response:
    """Every subscription, oldest first; secrets are never shown."""
    admin(WHAT)
    return respond(WebhookList(webhooks=transaction(webhook_store.all_of)))


@bp.delete("/<int:webhook_id>")
@operation(responses={200: Webhook}, errors=(403, 404))
def remove_webhook(webhook_id: int) -> Response:
    """Remove a subscription; it answers as it was."""
    admin(WHAT)
    return respond(transaction(lambda conn: webhook_store.remove(conn, webhook_id), write=True))
