"""collector_event_id() and collector_feed_horizon() in PL/pgSQL: their plans kept per session

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-07

Hand-written: autogenerate sees no functions. Both were SQL functions reading
``event_id_shift``. PostgreSQL inlines a SQL function only when its body reads no table,
so before version 18 each statement that called one parsed and planned its body again:
about 50 µs of server CPU per event insert (the column default) and 20 µs per feed read,
a tenth of a lifecycle PUT's server time (docs/performance.md). PL/pgSQL keeps the plan of
its SELECT for the life of the session.

Same results, same volatility: the id's SELECT still takes a fresh snapshot (VOLATILE), so
it sees a shift ``event_ids.settle`` has just committed; the horizon still reads the
calling statement's snapshot (STABLE) and is evaluated once per statement. No data
changes; code of any version runs on either definition.
"""

from __future__ import annotations

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

PLPGSQL = {
    "collector_event_id": (
        "VOLATILE PARALLEL UNSAFE",
        "pg_current_xact_id()::text::bigint + (SELECT shift FROM event_id_shift)",
    ),
    "collector_feed_horizon": (
        "STABLE PARALLEL SAFE",
        "pg_snapshot_xmin(pg_current_snapshot())::text::bigint + (SELECT shift FROM event_id_shift)",
    ),
}
# As revision 0008 created them.
SQL = {
    "collector_event_id": (
        "VOLATILE PARALLEL UNSAFE",
        "SELECT pg_current_xact_id()::text::bigint + shift FROM event_id_shift",
    ),
    "collector_feed_horizon": (
        "STABLE PARALLEL SAFE",
        "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint + shift FROM event_id_shift",
    ),
}


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for name, (marks, expression) in PLPGSQL.items():
        op.execute(f"CREATE OR REPLACE FUNCTION {name}() RETURNS bigint LANGUAGE plpgsql {marks} AS "
                   f"$$ BEGIN RETURN {expression}; END $$")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for name, (marks, body) in SQL.items():
        op.execute(f"CREATE OR REPLACE FUNCTION {name}() RETURNS bigint LANGUAGE sql {marks} AS $$ {body} $$")
