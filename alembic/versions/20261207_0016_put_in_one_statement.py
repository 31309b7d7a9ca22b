"""collector_put_job(): a lifecycle PUT on a stored job in one statement

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-07

Hand-written: autogenerate sees no functions. A PUT took two round trips: the job's lock
with its rows, then the write with COMMIT. Nearly every PUT a reporter sends lands on its
job's own row, in order. collector_put_job() takes the job id's lock and, in that case
only, applies the PUT as store/jobs.py does (jobs._apply, writes.save): status, and stage
and message reset when the status changes; the fillable fields where sent; artifacts and
metadata merged key by key (collector_merged(), as jobs._merged); a placeholder's name from
metadata.job_name; its event if (status, stage, message) changed; its count if the status
did. It returns the job's row id, cluster, status, stage and message and the event's id
(NULL without one). It returns no row, having changed nothing, for every other case: no
row yet (a placeholder to make), a cluster to claim, an ambiguous job id, a late PUT. The
general path then decides, so those rules stay in Python alone.

VOLATILE, so each SELECT takes its snapshot after the lock is granted (as revision 0009).
No data changes; code of 0015 never calls either function.
"""

from __future__ import annotations

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

MERGED = """
CREATE FUNCTION collector_merged(base jsonb, patch jsonb, base_wins boolean) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    merged jsonb;
    name text;
    value jsonb;
    current jsonb;
BEGIN
    -- No patch, or an empty one, leaves the document as it is (a missing one stays missing).
    IF patch IS NULL OR patch = '{}'::jsonb THEN
        RETURN base;
    END IF;
    merged := coalesce(base, '{}'::jsonb);
    FOR name, value IN SELECT key, j.value FROM jsonb_each(patch) AS j LOOP
        current := merged -> name;
        IF jsonb_typeof(current) = 'object' AND jsonb_typeof(value) = 'object' THEN
            merged := jsonb_set(merged, ARRAY[name], collector_merged(current, value, base_wins));
        -- A null never erases a known value: reporters send "unknown" as null.
        ELSIF current IS NULL OR current = 'null'::jsonb OR (value <> 'null'::jsonb AND NOT base_wins) THEN
            merged := jsonb_set(merged, ARRAY[name], value);
        END IF;
    END LOOP;
    RETURN merged;
END
$$
"""

PUT_JOB = """
CREATE FUNCTION collector_put_job(
    namespace integer, wanted text, wanted_cluster text, new_status text, new_stage text, new_message text,
    new_started_at timestamptz, new_completed_at timestamptz, new_exit_code integer, new_logs_url text,
    new_benchmark_results jsonb, new_artifacts jsonb, new_metadata jsonb, reported_name text,
    new_updated_at timestamptz, received timestamptz, writer text, stripe smallint)
RETURNS TABLE (job_pk integer, cluster text, status text, stage text, message text, event_id bigint)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE AS $$
#variable_conflict use_column
DECLARE
    job jobs%ROWTYPE;
    next_stage text;
    next_message text;
    event bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(namespace, hashtext(wanted));
    -- The row identity.find_for_write picks when it has nothing to claim: the cluster's own
    -- row, or without a cluster the cluster-less row, else the only one.
    IF wanted_cluster <> '' THEN
        SELECT * INTO job FROM jobs j WHERE j.job_id = wanted AND j.cluster = wanted_cluster;
    ELSE
        SELECT * INTO job FROM jobs j WHERE j.job_id = wanted AND j.cluster = '';
        IF job.id IS NULL THEN
            SELECT * INTO job FROM jobs j WHERE j.job_id = wanted
                AND (SELECT count(*) FROM jobs k WHERE k.job_id = wanted) = 1;
        END IF;
    END IF;
    -- No row, or a late PUT (jobs.is_late): the general path.
    IF job.id IS NULL OR (job.status <> 'submitted' AND new_updated_at < job.updated_at) THEN
        RETURN;
    END IF;
    -- stage and message describe the status they came with (jobs._apply).
    next_stage := CASE WHEN new_stage IS NOT NULL THEN new_stage
                       WHEN new_status <> job.status THEN NULL ELSE job.stage END;
    next_message := CASE WHEN new_message IS NOT NULL THEN new_message
                         WHEN new_status <> job.status THEN NULL ELSE job.message END;
    UPDATE jobs j SET
        job_name = CASE WHEN j.is_placeholder AND reported_name <> '' AND j.job_name = 'job-' || wanted
                        THEN reported_name ELSE j.job_name END,
        status = new_status, stage = next_stage, message = next_message,
        started_at = coalesce(new_started_at, j.started_at),
        completed_at = coalesce(new_completed_at, j.completed_at),
        exit_code = coalesce(new_exit_code, j.exit_code),
        logs_url = coalesce(new_logs_url, j.logs_url),
        benchmark_results = coalesce(new_benchmark_results, j.benchmark_results),
        artifacts = collector_merged(j.artifacts, new_artifacts, false),
        metadata = collector_merged(j.metadata, new_metadata, false),
        updated_at = new_updated_at, received_at = received
    WHERE j.id = job.id;
    IF (new_status, next_stage, next_message) IS DISTINCT FROM (job.status, job.stage, job.message) THEN
        INSERT INTO job_events (job_pk, status, stage, message, created_at, credential)
        VALUES (job.id, new_status, next_stage, next_message, new_updated_at, writer) RETURNING id INTO event;
    END IF;
    IF new_status <> job.status THEN
        -- As pg_driver's counted CTE: rows in key order, so no two writers wait in a cycle.
        INSERT INTO job_count_stripes AS s (cluster, status, stripe, jobs)
        SELECT v.cluster, v.status, collector_put_job.stripe, v.delta
        FROM (VALUES (job.cluster, job.status, -1::bigint), (job.cluster, new_status, 1::bigint))
            AS v (cluster, status, delta)
        ORDER BY v.cluster, v.status
        ON CONFLICT ON CONSTRAINT pk_job_count_stripes DO UPDATE SET jobs = s.jobs + excluded.jobs;
    END IF;
    RETURN QUERY SELECT job.id, job.cluster::text, new_status, next_stage, next_message, event;
END
$$
"""


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(MERGED)
        op.execute(PUT_JOB)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION collector_put_job(integer, text, text, text, text, text, timestamptz, timestamptz, "
                   "integer, text, jsonb, jsonb, jsonb, text, timestamptz, timestamptz, text, smallint)")
        op.execute("DROP FUNCTION collector_merged(jsonb, jsonb, boolean)")
