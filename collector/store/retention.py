"""Retention: delete finished jobs, or only their logs and captures, past a cutoff, in batches."""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools

from sqlalchemy import ColumnElement
from sqlalchemy import Connection
from sqlalchemy import delete
from sqlalchemy import exists
from sqlalchemy import func
from sqlalchemy import select

from collector.contract import JobStatus
from collector.store import counts
from collector.store.blobs import FILES
from collector.store.core import Run
from collector.store.identity import JOBS
from collector.store.identity import lock_job_id

FINISHED = (JobStatus.COMPLETED.value, JobStatus.FAILED.value)


@dataclasses.dataclass
class Pruned:
    """What a prune removed (or, dry, would remove)."""

    jobs: int = 0
    files: int = 0
    bytes: int = 0


@dataclasses.dataclass(frozen=True)
class Selection:
    """Which jobs a prune touches: finished before ``cutoff``, optionally one cluster or status."""

    cutoff: dt.datetime
    cluster: str | None = None
    statuses: tuple[str, ...] = FINISHED
    logs_only: bool = False

    def where(self) -> list[ColumnElement[bool]]:
        clauses = [JOBS.c.status.in_(self.statuses), JOBS.c.updated_at < self.cutoff]
        if self.cluster is not None:
            clauses.append(JOBS.c.cluster == self.cluster)
        if self.logs_only:
            clauses.append(exists().where(FILES.c.job_pk == JOBS.c.id))
        return clauses


def _batch(conn: Connection, selection: Selection, after: int, size: int) -> list[tuple[int, str]]:
    rows = conn.execute(
        select(JOBS.c.id, JOBS.c.job_id).where(*selection.where(), JOBS.c.id > after).order_by(JOBS.c.id).limit(size)
    )
    return [(pk, job_id) for pk, job_id in rows]


def _blob_totals(conn: Connection, pks: list[int]) -> tuple[int, int]:
    files, size = conn.execute(
        select(func.count(), func.coalesce(func.sum(FILES.c.size), 0)).where(FILES.c.job_pk.in_(pks))
    ).one()
    return int(files), int(size)


def _prune_batch(conn: Connection, selection: Selection, batch: list[tuple[int, str]], dry_run: bool) -> Pruned:
    pks = [pk for pk, _ in batch]
    if dry_run:
        return Pruned(len(pks), *_blob_totals(conn, pks))
    # Writers of these jobs wait (sorted: two prunes cannot deadlock), so the conditions
    # re-checked below and the counts moved are exact.
    for job_id in sorted({job_id for _pk, job_id in batch}):
        lock_job_id(conn, job_id)
    pks = [pk for (pk,) in conn.execute(select(JOBS.c.id).where(JOBS.c.id.in_(pks), *selection.where()))]
    files, size = _blob_totals(conn, pks)
    if selection.logs_only:
        conn.execute(delete(FILES).where(FILES.c.job_pk.in_(pks)))  # chunks cascade
    else:
        gone = conn.execute(delete(JOBS).where(JOBS.c.id.in_(pks)).returning(JOBS.c.cluster, JOBS.c.status))
        for cluster, status in gone.all():
            counts.move(conn, (cluster, status), None)
    return Pruned(len(pks), files, size)


def _step(conn: Connection, *, selection: Selection, after: int, size: int,
          dry_run: bool) -> tuple[list[tuple[int, str]], Pruned]:
    """One batch of a prune: the next jobs after ``after`` and what removing them removed."""
    batch = _batch(conn, selection, after, size)
    return batch, (_prune_batch(conn, selection, batch, dry_run) if batch else Pruned())


def prune(run: Run, selection: Selection, *, dry_run: bool = False, batch_size: int = 200) -> Pruned:
    """Remove what ``selection`` names, one short write transaction per batch of jobs.

    ``run`` is ``Database.run``; writers get the database between batches, so a prune of
    any size never locks them out for longer than one batch.
    """
    total, after = Pruned(), 0
    while True:
        step = functools.partial(_step, selection=selection, after=after, size=batch_size, dry_run=dry_run)
        batch, done = run(step, write=not dry_run)
        if not batch:
            return total
        after = batch[-1][0]
        total = Pruned(total.jobs + done.jobs, total.files + done.files, total.bytes + done.bytes)
