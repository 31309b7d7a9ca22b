"""Capture segments: fixed-size immutable files (Tachometer ``out-N.parquet``) uploaded in order.

Chunks arrive sequentially from offset 0 toward a declared ``total``; exact retries are
idempotent, anything else that disagrees with the stored segment is a conflict. The
bytes are stored verbatim and checksummed once the last one is committed (``seal``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from sqlalchemy import Connection

from collector.store import blobs
from collector.store import pg_driver
from collector.store.core import Run
from collector.store.errors import Conflict
from collector.store.errors import NotFound
from collector.store.errors import Unprocessable


@dataclasses.dataclass(frozen=True)
class Progress:
    """A chunk's answer, as the reporter checks it, whether this chunk completed the segment, and its new bytes."""

    next_offset: int
    complete: bool
    completed_now: bool = False
    new_bytes: int = 0


def prefetch(job_id: str, name: str, offset: int, data: bytes) -> pg_driver.Query:
    """What ``append`` reads first, to send with the job's lock (``jobs.ensure``) and hand back to it."""
    return blobs.overlapping_query(job_id, blobs.CAPTURE, name, offset, blobs.end_of(name, offset, data))


def append(conn: Connection, job_pk: int, name: str, offset: int, total: int, data: bytes, *,
           now: dt.datetime, prefetched: pg_driver.Query | None = None) -> Progress:
    """Store one chunk, committing with the write on PostgreSQL (nothing may follow it in the transaction).

    For an exact retry of an earlier chunk the answer is ``(offset + len, complete and it
    was the last chunk)``, so a reporter that lost an answer gets the one it expected.
    ``prefetched`` is this chunk's ``prefetch`` if it went with the job's lock.
    """
    end = blobs.end_of(name, offset, data)
    if end > total:
        raise Unprocessable(f"bytes {offset}-{end} of {name} run past its total of {total}")
    file, overlapping = blobs.find_with_overlapping(conn, job_pk, blobs.CAPTURE, name, offset, end,
                                                    prefetched=prefetched)
    if file is None:
        file = blobs.new_file(job_pk, blobs.CAPTURE, name, now, total=total)
    elif file["total"] != total:
        raise Conflict(f"segment {name} was started with total {file['total']}, not {total}",
                       file=name, total=file["total"])
    size = file["size"]
    if offset < size or (offset == size and file["done"]):
        exact = any(stored == (offset, end, data) for stored in overlapping)
        if not exact and not (len(data) == 0 and offset == size):
            raise Conflict(f"bytes {offset}-{end} of {name} differ from the stored segment, which holds "
                           f"{size} of {total} bytes", file=name, next_offset=size)
        last = file["done"] and end == total
        # A replay of the completing chunk whose first run committed but never got to
        # seal (its answer was lost): seal now, or the checksum waits for a download.
        return Progress(end, last, completed_now=last and file["sha256"] is None)
    if offset > size:
        raise Conflict(f"segment {name} continues at offset {size}, not {offset}",
                       file=name, next_offset=size)
    complete = end == total
    file.update(updated_at=now, size=end, stored_end=end, done=complete)
    blobs.write(conn, file, offset, data or None, commit=True)
    return Progress(end, complete, completed_now=complete, new_bytes=len(data))


def files(conn: Connection, job_pk: int) -> list[blobs.FileRow]:
    """The job's capture segments, complete or not."""
    return blobs.files_of(conn, job_pk, blobs.CAPTURE)


def seal(run: Run, job_pk: int, name: str) -> str:
    """Checksum a complete segment once and record it; returns the hex SHA-256.

    Outside the upload's transaction, so the job's write lock is not held while every
    chunk is read back: a read-only pass (no lock on either database), then a short
    write. Run after the completing chunk commits, and by a download that finds no
    checksum (the collector stopped in between).
    """
    def read(conn: Connection) -> tuple[int, str | None, str]:
        file = complete_segment(conn, job_pk, name)
        known = file["sha256"]
        return file["id"], known, known or blobs.checksum(conn, file["id"])

    file_id, known, digest = run(read)
    if known is None:
        run(lambda conn: blobs.record_checksum(conn, file_id, digest), write=True)
    return digest


def complete_segment(conn: Connection, job_pk: int, name: str) -> blobs.FileRow:
    """The file row of a complete segment; 404 while it is missing or partial."""
    file = blobs.find_file(conn, job_pk, blobs.CAPTURE, name)
    if file is None:
        raise NotFound(f"no capture segment {name!r} for this job")
    if not file["done"]:
        raise NotFound(f"capture segment {name!r} is partial: {file['size']} of {file['total']} bytes stored")
    return file
