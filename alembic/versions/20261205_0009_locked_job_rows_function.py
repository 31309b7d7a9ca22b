"""collector_locked_rows(): a PostgreSQL write takes its job's lock and reads its rows in one statement

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-05

Hand-written: autogenerate sees no functions. The write path (collector/store/pg_driver.py)
used to send the lock and the read as two statements in one pipeline; psycopg's pipeline
costs more Python per statement than the statements themselves (docs/performance.md).

VOLATILE, so the SELECT takes its snapshot after the lock is granted (PostgreSQL gives a
volatile function a fresh snapshot for each statement in it) and sees whatever the
previous holder of the lock committed. Rows come back as ``jobs`` rows, whatever columns
a later revision adds; the caller names the ones it reads.

No data changes; 0008 code never calls it, so it may be applied before the new code rolls
out and dropped after the old code is back.
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

LOCKED_ROWS = """
CREATE FUNCTION collector_locked_rows(namespace integer, wanted text) RETURNS SETOF jobs
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(namespace, hashtext(wanted));
    RETURN QUERY SELECT * FROM jobs WHERE jobs.job_id = wanted ORDER BY jobs.id;
END
$$
"""


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(LOCKED_ROWS)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION collector_locked_rows(integer, text)")
