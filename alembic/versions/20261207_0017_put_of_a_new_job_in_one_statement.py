"""collector_put_job() also makes the placeholder of a job's first PUT

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-07

Hand-written: autogenerate sees no functions. A PUT for a job with no row (its POST never
arrived, or the reporter sends none) took three round trips: collector_put_job() found no
row and declined, then the general path locked and read the job id's rows and inserted
the placeholder. Now the function inserts it itself when the general path would
(identity.find_for_write finds nothing: no row on the PUT's cluster and no cluster-less one
to claim; without a cluster, no row of the job id at all), as jobs.update builds it: the
reported name or ``job-<id>``, first seen at the earlier of ``updated_at`` and
``started_at``, the PUT applied to it, its event and its count. A cluster-less row to
claim, or rows to choose among, still return nothing, having changed nothing.

Same signature and result, so code of 0016 runs on either definition: it gets the row
it would have made itself. No data changes.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

PUT_JOB = """
CREATE OR REPLACE FUNCTION collector_put_job(
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
    IF job.id IS NULL THEN
        -- A cluster-less row to claim, or (without a cluster) rows to choose among: the general path.
        IF EXISTS (SELECT FROM jobs j WHERE j.job_id = wanted AND (j.cluster = '' OR wanted_cluster = '')) THEN
            RETURN;
        END IF;
        -- No row at all: the placeholder jobs.update makes, the PUT applied to it.
        INSERT INTO jobs AS j (cluster, job_id, job_name, is_placeholder, status, stage, message, recipe,
                               submitted_at, started_at, completed_at, updated_at, exit_code, logs_url,
                               benchmark_results, artifacts, metadata, received_at)
        VALUES (wanted_cluster, wanted, coalesce(nullif(reported_name, ''), 'job-' || wanted), true, new_status,
                new_stage, new_message, NULL, least(new_updated_at, new_started_at), new_started_at,
                new_completed_at, new_updated_at, new_exit_code, new_logs_url, new_benchmark_results,
                collector_merged(NULL, new_artifacts, false), collector_merged(NULL, new_metadata, false), received)
        RETURNING j.id INTO job.id;
        INSERT INTO job_events (job_pk, status, stage, message, created_at, credential)
        VALUES (job.id, new_status, new_stage, new_message, new_updated_at, writer) RETURNING id INTO event;
        INSERT INTO job_count_stripes AS s (cluster, status, stripe, jobs)
        VALUES (wanted_cluster, new_status, collector_put_job.stripe, 1)
        ON CONFLICT ON CONSTRAINT pk_job_count_stripes DO UPDATE SET jobs = s.jobs + excluded.jobs;
        RETURN QUERY SELECT job.id, wanted_cluster, new_status, new_stage, new_message, event;
        RETURN;
    END IF;
    -- A late PUT (jobs.is_late): the general path.
    IF job.status <> 'submitted' AND new_updated_at < job.updated_at THEN
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


def _revision_0016_put_job() -> str:
    """The function as revision 0016 created it (its module's name starts with a digit)."""
    path = Path(__file__).with_name("20261207_0016_put_in_one_statement.py")
    spec = importlib.util.spec_from_file_location("revision_0016", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text: str = module.PUT_JOB
    return text.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(PUT_JOB)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_revision_0016_put_job())
