"""``/api/webhooks``: subscriptions to job events (admins only); ``/api/jobs/{id}/deliveries``: what they sent."""

from __future__ import annotations

import datetime as dt

from flask import Blueprint
from flask import Response
from sqlalchemy import Connection

from collector.api import admin
from collector.api import checked_job_id
from collector.api import parse_body
from collector.api import parse_query
from collector.api import respond
from collector.api.queries import ClusterQuery
from collector.db import transaction
from collector.openapi import JSON
from collector.openapi import operation
from collector.store import deliveries as delivery_store
from collector.store import jobs as job_store
from collector.store import webhooks as webhook_store
from collector.webhook_contract import JobDeliveryList
from collector.webhook_contract import Webhook
from collector.webhook_contract import WebhookCreate
from collector.webhook_contract import WebhookList

bp = Blueprint("webhooks", __name__, url_prefix="/api")
# A subscription names a URL the collector will call: only admins choose those (and see
# them: a Slack webhook's URL is itself a secret).
WHAT = "webhooks"


@bp.post("/webhooks")
@operation(body={JSON: WebhookCreate}, responses={201: Webhook}, errors=(403,))
def add_webhook() -> Response:
    """Subscribe a URL to job events of the given statuses (default: finished) and clusters (default: all)."""
    created_by = admin(WHAT)
    subscription = parse_body(WebhookCreate)
    now = dt.datetime.now(dt.UTC)
    return respond(transaction(lambda conn: webhook_store.add(conn, subscription, now, created_by=created_by),
                               write=True), 201)


@bp.get("/webhooks")
@operation(responses={200: WebhookList}, errors=(403,))
def list_webhooks() -> Response:
    """Every subscription, oldest first; secrets are never shown."""
    admin(WHAT)
    return respond(WebhookList(webhooks=transaction(webhook_store.all_of)))


@bp.delete("/webhooks/<int:webhook_id>")
@operation(responses={200: Webhook}, errors=(403, 404))
def remove_webhook(webhook_id: int) -> Response:
    """Remove a subscription; it answers as it was."""
    admin(WHAT)
    return respond(transaction(lambda conn: webhook_store.remove(conn, webhook_id), write=True))


@bp.get("/jobs/<job_id>/deliveries")
@operation(query=ClusterQuery, responses={200: JobDeliveryList}, errors=(404, 409))
def job_deliveries(job_id: str) -> Response:
    """The webhook deliveries of a job's events (any reader: no URL, no receiver's answer), oldest first."""
    query = parse_query(ClusterQuery)
    job_id = checked_job_id(job_id)

    def read(conn: Connection) -> JobDeliveryList:
        job_pk, cluster = job_store.resolve(conn, job_id, query.cluster)
        return JobDeliveryList(job_id=job_id, cluster=cluster, deliveries=delivery_store.of_job(conn, job_pk))

    return respond(transaction(read))
