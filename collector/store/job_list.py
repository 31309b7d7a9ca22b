"""The job list: filters, search, sort orders and paging of ``GET /api/jobs``."""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any

from sqlalchemy import ColumnElement
from sqlalchemy import Connection
from sqlalchemy import Select
from sqlalchemy import Text
from sqlalchemy import UnaryExpression
from sqlalchemy import and_
from sqlalchemy import bindparam
from sqlalchemy import case
from sqlalchemy import exists
from sqlalchemy import func
from sqlalchemy import literal
from sqlalchemy import literal_column
from sqlalchemy import or_
from sqlalchemy import select
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects import sqlite
from sqlalchemy.dialects.postgresql import JSONB

from collector.contract import JobStatus
from collector.contract import JobSummary
from collector.store import counts
from collector.store import pg_driver
from collector.store import sqlite_driver
from collector.store.identity import JOBS
from collector.store.identity import is_postgres
from collector.store.identity import wire_cluster
from collector.store.jobs import SUMMARY_COLUMNS
from collector.store.pg_driver import Query
from collector.store.pg_driver import Statement

# A search has no maintained count, so its total is a COUNT over the matches; past this
# many it stops counting (the page itself never needed more) and says the total is a floor.
MAX_SEARCH_COUNT = 10_000
_SUMMARY_SELECT = [JOBS.c[name] for name in SUMMARY_COLUMNS]
_POSTGRES = postgresql.psycopg.dialect()  # type: ignore[no-untyped-call]  # SQLAlchemy's dialects are untyped
_SQLITE = sqlite.dialect()
_LIFECYCLE = {status.value: rank for rank, status in enumerate(JobStatus)}
_ESCAPE = "\\"
# Text that JSON may store escaped (quotes, backslashes, controls; non-ASCII, which
# Python's json writes as \uXXXX): a search holding any cannot use the raw-text prefilter.
_JSON_ESCAPED = re.compile(r'[^\x20-\x7e]|["\\]')


@dataclasses.dataclass(frozen=True)
class JobPage:
    """One page of the list, with the number of matching jobs (a floor when not ``exact``)."""

    jobs: list[JobSummary]
    total: int
    exact: bool


def like_pattern(text: str) -> str:
    """``%text%`` with LIKE's wildcards and the escape character taken literally."""
    escaped = text.replace(_ESCAPE, _ESCAPE * 2).replace("%", _ESCAPE + "%").replace("_", _ESCAPE + "_")
    return f"%{escaped}%"


def _tag_matches(conn: Connection, text: str, pattern: str) -> ColumnElement[bool]:
    # Tags are whatever a reporter sent: the strings of a list, or a lone string, are
    # searched; numbers, objects and anything else are not tags. The same on both databases.
    if is_postgres(conn):
        tags = JOBS.c["metadata"]["tags"]
        kind = func.jsonb_typeof(tags)
        # jsonb_array_elements refuses a non-array.
        array = case((kind == "array", tags), (kind == "string", func.jsonb_build_array(tags)),
                     else_=literal([], JSONB))
        elements = func.jsonb_array_elements(array).table_valued("value").render_derived()
        is_text = func.jsonb_typeof(elements.c.value) == "string"
        value: ColumnElement[Any] = elements.c.value.op("#>>", return_type=Text)(literal_column("'{}'"))
    else:
        # json_each walks an array's elements, and yields a lone value as one row.
        elements = func.json_each(JOBS.c["metadata"], "$.tags").table_valued("value", "type")
        is_text = elements.c.type == "text"
        value = elements.c.value
    matches = exists(select(1).select_from(elements).where(is_text, value.ilike(pattern, escape=_ESCAPE)))
    if not _JSON_ESCAPED.search(text):
        # Unpacking every row's tags is most of a search's cost. The tags' JSON text holds
        # any tag's text verbatim unless JSON escapes it (quotes, backslashes, controls),
        # so a LIKE over that text first rules out nearly every row for a fraction of it.
        return and_(JOBS.c["metadata"]["tags"].as_string().ilike(pattern, escape=_ESCAPE), matches)
    return matches


def search(conn: Connection, text: str) -> ColumnElement[bool]:
    """Jobs whose id, name, recipe or one of whose tags holds ``text``, ignoring case.

    ILIKE on PostgreSQL; on SQLite lower() LIKE lower(), which folds ASCII letters only.
    """
    pattern = like_pattern(text)
    columns = (JOBS.c.job_id, JOBS.c.job_name, JOBS.c.recipe)
    return or_(*(column.ilike(pattern, escape=_ESCAPE) for column in columns), _tag_matches(conn, text, pattern))


def _order(sort: str, descending: bool) -> list[UnaryExpression[Any]]:
    def direction(column: ColumnElement[Any]) -> UnaryExpression[Any]:
        return column.desc() if descending else column.asc()

    if sort == "submitted":
        # The index order (ix_jobs_*_submitted_at_id), read backwards for newest first.
        return [direction(JOBS.c.submitted_at), direction(JOBS.c.id)]
    if sort == "updated":
        return [direction(JOBS.c.updated_at), direction(JOBS.c.id)]
    if sort == "job_id":
        # Slurm ids are numbers: shorter first puts 99 before 100 without casting.
        primary = [direction(func.length(JOBS.c.job_id)), direction(JOBS.c.job_id), direction(JOBS.c.cluster)]
    elif sort == "status":
        # Lifecycle order (submitted ... completed, failed, timeout), not the alphabet.
        primary = [direction(case(_LIFECYCLE, value=JOBS.c.status, else_=len(_LIFECYCLE)))]
    elif sort == "cluster":
        primary = [direction(JOBS.c.cluster)]
    else:
        raise ValueError(f"unknown sort {sort!r}")
    # Ties newest first, ending on the primary key so every page boundary is stable.
    return [*primary, JOBS.c.submitted_at.desc(), JOBS.c.id.desc()]


def page(
    conn: Connection,
    *,
    page: int,
    per_page: int,
    status: str | None = None,
    cluster: str | None = None,
    q: str | None = None,
    sort: str = "submitted",
    descending: bool = True,
) -> JobPage:
    """One page of jobs matching the filters and search, in the requested order."""
    if q is None and sort == "submitted":
        # The page a dashboard asks for most, as fixed statements on the driver itself.
        params = {"status": status, "cluster": cluster, "limit": per_page, "offset": (page - 1) * per_page}
        if is_postgres(conn):
            # One round trip of prepared statements.
            listing, counting = _postgres_page(status is not None, cluster is not None, descending)
            found, totals = pg_driver.execute_all(conn, [Query(listing, params), Query(counting, params)],
                                                  commit=True)
            return JobPage(jobs=[_summary(pg_driver.in_utc(row)) for row in found],
                           total=int(totals[0]["total"]), exact=True)
        listing_read, counting_read = _sqlite_page(status is not None, cluster is not None, descending)
        jobs = [_summary(row) for row in _sqlite_fetch(conn, listing_read, params)]
        return JobPage(jobs=jobs, total=int(_sqlite_fetch(conn, counting_read, params)[0]["total"]), exact=True)
    filters = []
    if status is not None:
        filters.append(JOBS.c.status == status)
    if cluster is not None:
        filters.append(JOBS.c.cluster == cluster)
    if q is not None:
        filters.append(search(conn, q))
    rows = conn.execute(
        select(*_SUMMARY_SELECT)
        .where(*filters)
        .order_by(*_order(sort, descending))
        .limit(per_page)
        .offset((page - 1) * per_page)
    ).mappings().all()
    if q is None:
        total, exact = counts.total(conn, status=status, cluster=cluster), True
    elif 0 < len(rows) < per_page or (page == 1 and not rows):
        # A short page is the last one: it says the total without a second scan.
        total, exact = (page - 1) * per_page + len(rows), True
    else:
        counted = conn.execute(
            select(func.count()).select_from(select(JOBS.c.id).where(*filters).limit(MAX_SEARCH_COUNT + 1).subquery())
        ).scalar_one()
        total, exact = min(counted, MAX_SEARCH_COUNT), counted <= MAX_SEARCH_COUNT
    return JobPage(jobs=[_summary(row) for row in rows], total=total, exact=exact)


def _summary(row: Any) -> JobSummary:
    return JobSummary(**{**{name: row[name] for name in SUMMARY_COLUMNS}, "cluster": wire_cluster(row["cluster"])})


def _default_page(by_status: bool, by_cluster: bool, descending: bool) -> tuple[Select[Any], Select[Any]]:
    # The queries the general path builds for a page without a search in submission order,
    # with the filters, limit and offset as named parameters.
    filters = [JOBS.c.status == bindparam("status")] if by_status else []
    filters += [JOBS.c.cluster == bindparam("cluster")] if by_cluster else []
    listed = (select(*_SUMMARY_SELECT).where(*filters).order_by(*_order("submitted", descending))
              .limit(bindparam("limit")).offset(bindparam("offset")))
    return listed, counts.total_query(by_status=by_status, by_cluster=by_cluster)


@functools.cache
def _postgres_page(by_status: bool, by_cluster: bool, descending: bool) -> tuple[Statement, Statement]:
    # Compiled once to fixed text for pg_driver; one pair per filter combination and
    # direction, so each keeps a plan of its own.
    listed, counted = _default_page(by_status, by_cluster, descending)
    key = f"{int(by_status)}{int(by_cluster)}{int(descending)}"
    return (pg_driver.statement(f"collector_list_{key}", _text(listed)),
            pg_driver.statement(f"collector_list_total_{key}", _text(counted)))


# A fixed SQLite statement and its parameters' names in placeholder order.
_SQLiteRead = tuple[sqlite_driver.Read, tuple[str, ...]]


@functools.cache
def _sqlite_page(by_status: bool, by_cluster: bool, descending: bool) -> tuple[_SQLiteRead, _SQLiteRead]:
    # Compiled once for sqlite_driver: SQLAlchemy's execution machinery was a fifth of a
    # page's time in the one process that serves a SQLite file, and fetch applies the same
    # type processors to what it reads.
    listed, counted = _default_page(by_status, by_cluster, descending)
    return _sqlite_read(listed), _sqlite_read(counted)


def _sqlite_read(query: Select[Any]) -> _SQLiteRead:
    compiled = query.compile(dialect=_SQLITE)
    assert compiled.positiontup is not None, "the SQLite dialect binds by position"
    return sqlite_driver.read(str(compiled), list(query.selected_columns)), tuple(compiled.positiontup)


def _sqlite_fetch(conn: Connection, query: _SQLiteRead, params: dict[str, Any]) -> list[dict[str, Any]]:
    read, names = query
    return sqlite_driver.fetch(conn, read, [params[name] for name in names])


def _text(query: Select[Any]) -> str:
    text = str(query.compile(dialect=_POSTGRES))
    # pg_driver takes %(name)s parameters and leaves everything else as written.
    assert "%%" not in text, text
    return text
