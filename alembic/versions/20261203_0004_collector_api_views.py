"""collector_api views for dashboards

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03

Hand-written (autogenerate does not see views). On PostgreSQL: schema
``collector_api`` with the views Grafana reads, documented column for column in
docs/dashboards.md, a compatibility promise: the tables under them may change, the
views keep their names, column names, order and types (new columns only at the end).
Every column is cast explicitly, so a later change to a table's column type cannot
leak into a view's. On SQLite this revision does nothing: dashboards are PostgreSQL only.

A later revision that changes a column these views read must drop and recreate the
affected view in the same revision (PostgreSQL refuses to alter a column a view uses).
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

SCHEMA = "collector_api"
# Statuses after which a job reports nothing more (the contract's JobStatus).
FINISHED = "('completed', 'failed', 'timeout')"
FAILED = "('failed', 'timeout')"


def _json_int(document: str) -> str:
    """A JSON number that fits an integer, else NULL: a stray string must not break a dashboard."""
    return (f"CASE WHEN jsonb_typeof({document}) = 'number' AND ({document} #>> '{{}}') ~ '^-?[0-9]{{1,9}}$' "
            f"THEN ({document} #>> '{{}}')::integer END")


JOBS = f"""
CREATE VIEW {SCHEMA}.jobs AS
SELECT
    j.cluster::text AS cluster,
    j.job_id::text AS job_id,
    j.job_name::text AS job_name,
    j.status::text AS status,
    j.stage::text AS stage,
    j.message::text AS message,
    (j.status IN {FINISHED})::boolean AS finished,
    j.submitted_at::timestamptz AS submitted_at,
    j.started_at::timestamptz AS started_at,
    j.completed_at::timestamptz AS completed_at,
    j.updated_at::timestamptz AS updated_at,
    (CASE WHEN j.status IN {FINISHED} THEN coalesce(j.completed_at, j.updated_at) END)::timestamptz AS finished_at,
    extract(epoch FROM j.started_at - j.submitted_at)::double precision AS queue_seconds,
    extract(epoch FROM coalesce(CASE WHEN j.status IN {FINISHED} THEN coalesce(j.completed_at, j.updated_at) END,
                                now()) - j.started_at)::double precision AS run_seconds,
    j.exit_code::integer AS exit_code,
    j.recipe::text AS recipe,
    j.logs_url::text AS logs_url,
    (j.metadata -> 'model' ->> 'path')::text AS model,
    (j.metadata -> 'model' ->> 'precision')::text AS model_precision,
    (j.metadata -> 'model' ->> 'container')::text AS container,
    (j.metadata -> 'resources' ->> 'gpu_type')::text AS gpu_type,
    ({_json_int("j.metadata -> 'resources' -> 'gpus_per_node'")})::integer AS gpus_per_node,
    (j.metadata ->> 'backend_type')::text AS backend_type,
    (j.metadata ->> 'frontend_type')::text AS frontend_type,
    (j.metadata -> 'benchmark' ->> 'type')::text AS benchmark_type,
    (j.metadata ->> 'head_node')::text AS head_node,
    (j.metadata ->> 'log_dir')::text AS log_dir,
    (CASE WHEN jsonb_typeof(j.metadata -> 'tags') = 'array' THEN
        ARRAY(SELECT t.tag FROM jsonb_array_elements_text(j.metadata -> 'tags') WITH ORDINALITY AS t(tag, n)
              ORDER BY t.n)
     END)::text[] AS tags,
    j.is_placeholder::boolean AS is_placeholder,
    nullif(j.metadata::jsonb, 'null'::jsonb) AS metadata,
    nullif(j.benchmark_results::jsonb, 'null'::jsonb) AS benchmark_results,
    nullif(j.artifacts::jsonb, 'null'::jsonb) AS artifacts
FROM jobs AS j
"""

JOB_EVENTS = f"""
CREATE VIEW {SCHEMA}.job_events AS
SELECT
    e.id::bigint AS event_id,
    j.cluster::text AS cluster,
    j.job_id::text AS job_id,
    j.job_name::text AS job_name,
    e.status::text AS status,
    e.stage::text AS stage,
    e.message::text AS message,
    e.created_at::timestamptz AS created_at
FROM job_events AS e
JOIN jobs AS j ON j.id = e.job_pk
"""

# A stage lasts from the first event that enters it to the next event that enters another
# stage or finishes the job. Events are ordered by the reporter's stamps (id breaks ties),
# so spans never overlap and closed spans never run backwards. Finishing events close the
# open span and open none: "completed/cleanup" ends cleanup, it does not start it again.
STAGE_DURATIONS = f"""
CREATE VIEW {SCHEMA}.stage_durations AS
WITH ordered AS (
    SELECT
        e.id, e.job_pk, e.status, e.stage, e.created_at,
        e.status IN {FINISHED} AS ends,
        lag(e.id) OVER w AS previous_id,
        lag(e.stage) OVER w AS previous_stage,
        lag(e.status IN {FINISHED}) OVER w AS previous_ends
    FROM job_events AS e
    WINDOW w AS (PARTITION BY e.job_pk ORDER BY e.created_at, e.id)
), boundaries AS (
    SELECT
        o.*,
        (NOT o.ends AND (o.previous_id IS NULL OR o.previous_ends
                         OR o.stage IS DISTINCT FROM o.previous_stage)) AS opens
    FROM ordered AS o
), spans AS (
    SELECT
        b.*,
        lead(b.created_at) OVER (PARTITION BY b.job_pk ORDER BY b.created_at, b.id) AS left_at
    FROM boundaries AS b
    WHERE b.opens OR b.ends
)
SELECT
    j.cluster::text AS cluster,
    j.job_id::text AS job_id,
    s.id::bigint AS event_id,
    s.stage::text AS stage,
    s.status::text AS status,
    s.created_at::timestamptz AS entered_at,
    s.left_at::timestamptz AS left_at,
    greatest(extract(epoch FROM coalesce(s.left_at, now()) - s.created_at), 0)::double precision AS seconds
FROM spans AS s
JOIN jobs AS j ON j.id = s.job_pk
WHERE s.opens
"""

CLUSTER_ACTIVITY = f"""
CREATE VIEW {SCHEMA}.cluster_activity AS
SELECT
    j.cluster::text AS cluster,
    count(*)::bigint AS jobs,
    (count(*) FILTER (WHERE j.status NOT IN {FINISHED}))::bigint AS active_jobs,
    (count(*) FILTER (WHERE j.status = 'submitted'))::bigint AS submitted_jobs,
    (count(*) FILTER (WHERE j.status = 'starting'))::bigint AS starting_jobs,
    (count(*) FILTER (WHERE j.status = 'workers'))::bigint AS workers_jobs,
    (count(*) FILTER (WHERE j.status = 'frontend'))::bigint AS frontend_jobs,
    (count(*) FILTER (WHERE j.status = 'benchmark'))::bigint AS benchmark_jobs,
    (count(*) FILTER (WHERE j.status = 'completed'))::bigint AS completed_jobs,
    (count(*) FILTER (WHERE j.status = 'failed'))::bigint AS failed_jobs,
    (count(*) FILTER (WHERE j.status = 'timeout'))::bigint AS timeout_jobs,
    (count(*) FILTER (WHERE j.submitted_at >= now() - interval '24 hours'))::bigint AS submitted_last_24h,
    (count(*) FILTER (WHERE j.status IN {FINISHED}
                      AND coalesce(j.completed_at, j.updated_at) >= now() - interval '24 hours'))::bigint
        AS finished_last_24h,
    (count(*) FILTER (WHERE j.status IN {FAILED}
                      AND coalesce(j.completed_at, j.updated_at) >= now() - interval '24 hours'))::bigint
        AS failed_last_24h,
    max(j.updated_at)::timestamptz AS last_report_at,
    extract(epoch FROM now() - max(j.updated_at))::double precision AS seconds_since_last_report
FROM jobs AS j
GROUP BY j.cluster
"""

# Dependents first on the way down.
VIEWS = ("cluster_activity", "stage_durations", "job_events", "jobs")


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(f"CREATE SCHEMA {SCHEMA}")
    op.execute(f"COMMENT ON SCHEMA {SCHEMA} IS 'Stable views for dashboards: docs/dashboards.md'")
    for statement in (JOBS, JOB_EVENTS, STAGE_DURATIONS, CLUSTER_ACTIVITY):
        op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for view in VIEWS:
        op.execute(f"DROP VIEW IF EXISTS {SCHEMA}.{view}")
    # Not CASCADE: anything an operator added to the schema stops the downgrade instead of vanishing.
    op.execute(f"DROP SCHEMA IF EXISTS {SCHEMA}")
