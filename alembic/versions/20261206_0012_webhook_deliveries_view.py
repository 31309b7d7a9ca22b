"""the collector_api.webhook_deliveries view

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06

Hand-written (autogenerate does not see views), PostgreSQL only like revision 0004, and
documented in docs/dashboards.md: one row per webhook delivery with its event's job,
cluster and status, for a Grafana panel of what was sent, what is retrying and what
died. Never the subscription's URL or secret: a Slack webhook's URL is itself a secret,
and the dashboards' role reads every view.
"""

from __future__ import annotations

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

SCHEMA = "collector_api"
WEBHOOK_DELIVERIES = f"""
CREATE VIEW {SCHEMA}.webhook_deliveries AS
SELECT
    d.id::bigint AS delivery_id,
    d.webhook_id::integer AS webhook_id,
    d.event_id::bigint AS event_id,
    j.cluster::text AS cluster,
    j.job_id::text AS job_id,
    e.status::text AS event_status,
    d.state::text AS state,
    d.attempts::integer AS attempts,
    d.last_status::integer AS last_status,
    d.last_error::text AS last_error,
    d.created_at::timestamptz AS created_at,
    d.next_attempt_at::timestamptz AS next_attempt_at,
    d.sent_at::timestamptz AS sent_at
FROM webhook_deliveries AS d
JOIN job_events AS e ON e.id = d.event_id
JOIN jobs AS j ON j.id = e.job_pk
"""


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(WEBHOOK_DELIVERIES)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"DROP VIEW IF EXISTS {SCHEMA}.webhook_deliveries")
