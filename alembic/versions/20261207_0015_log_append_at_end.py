"""collector_append_log_at_end(): a log upload at the end of its file in one statement

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07

Hand-written: autogenerate sees no functions. A log upload on PostgreSQL took two round
trips: the job's lock with its rows and the file's, then the write with COMMIT. Nearly
every upload a streamer sends lands where its file ends, on a job and file that exist;
this function takes the same lock and, when the upload is that case, stores it and
returns the file's id; otherwise it changes nothing and returns NULL, and the upload takes
the general path (store/logs.py), whose rules decide everything else: the first chunk of
a file, a cluster claim, a gap, an overlap or resend, a final mark.

VOLATILE, so each SELECT takes its snapshot after the lock is granted, as in
collector_locked_rows() (revision 0009). No data changes; code of 0014 never calls it.
"""

from __future__ import annotations

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

APPEND_AT_END = """
CREATE FUNCTION collector_append_log_at_end(namespace integer, wanted text, wanted_cluster text, file_key text,
                                            at bigint, bytes bytea, stamp timestamptz) RETURNS integer
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE AS $$
DECLARE
    job integer;
    file blob_files%ROWTYPE;
    stop bigint := at + length(bytes);
BEGIN
    PERFORM pg_advisory_xact_lock(namespace, hashtext(wanted));
    -- The row identity.find_for_write picks when it has nothing to claim: the cluster's own
    -- row, or without a cluster the cluster-less row, else the only one.
    IF wanted_cluster <> '' THEN
        SELECT id INTO job FROM jobs WHERE job_id = wanted AND cluster = wanted_cluster;
    ELSE
        SELECT id INTO job FROM jobs WHERE job_id = wanted AND cluster = '';
        IF job IS NULL THEN
            SELECT min(id) INTO job FROM jobs WHERE job_id = wanted HAVING count(*) = 1;
        END IF;
    END IF;
    IF job IS NULL OR length(bytes) = 0 THEN
        RETURN NULL;
    END IF;
    SELECT * INTO file FROM blob_files WHERE job_pk = job AND kind = 'log' AND name_key = file_key;
    -- Contiguous up to this offset, nothing stored past it, not finalized: new bytes at the end.
    IF file.id IS NULL OR file.final_size IS NOT NULL OR file.size <> at OR file.stored_end <> at THEN
        RETURN NULL;
    END IF;
    INSERT INTO blob_chunks (file_id, start_offset, end_offset, data) VALUES (file.id, at, stop, bytes);
    UPDATE blob_files SET size = stop, stored_end = stop, updated_at = stamp WHERE id = file.id;
    RETURN file.id;
END
$$
"""


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(APPEND_AT_END)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION collector_append_log_at_end(integer, text, text, text, bigint, bytea, timestamptz)")
