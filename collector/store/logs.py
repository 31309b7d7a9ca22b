"""Streamed log files: append-only bytes at source offsets, read back as UTF-8 text.

Uploads may repeat, overlap and (after an uploader restart) leave gaps; identical bytes
are never stored twice and different bytes for a stored range are a conflict. Text is
decoded at read time, so a character split across uploads reads whole.
"""

from __future__ import annotations

import codecs
import datetime as dt
from typing import Any
from typing import NamedTuple

from sqlalchemy import Connection

from collector.store import blobs
from collector.store import jobs
from collector.store import pg_driver
from collector.store.errors import Conflict
from collector.store.errors import NotFound
from collector.store.identity import JOB_LOCK
from collector.store.identity import NO_CLUSTER
from collector.store.identity import is_postgres

# A read returns at most this many bytes of the file (the reporter's chunk size).
MAX_READ_BYTES = 1024 * 1024
Chunk = tuple[str, int, bytes, bool]  # an upload's file name, offset, bytes and final mark


def _range_conflict(name: str, lo: int, hi: int, why: str) -> Conflict:
    return Conflict(f"bytes {lo}-{hi} of {name} {why}", file=name, range=[lo, hi])


class Appended(NamedTuple):
    """What an upload changed: anything at all (bytes or the final mark), and how many bytes are new."""

    changed: bool
    new_bytes: int


def upload(conn: Connection, job_id: str, cluster: str | None, chunks: list[Chunk], *, now: dt.datetime,
           credential: str | None = None) -> tuple[bool, list[Appended]]:
    """Store an upload's chunks on its job (a placeholder if it has none yet).

    Whether the job was created, and what each chunk changed.
    """
    if len(chunks) == 1 and not chunks[0][3]:
        # A streamer's next bytes, where its file ends: one round trip on PostgreSQL.
        name, offset, data, _ = chunks[0]
        if append_at_end(conn, job_id, cluster, name, offset, data, now=now):
            return False, [Appended(True, len(data))]
    # A single upload's file and the bytes around it are read with the job's lock, in its round trip.
    first = prefetch(job_id, *chunks[0][:3]) if len(chunks) == 1 else None
    job_pk, _, created = jobs.ensure(conn, job_id, cluster, now, credential=credential, prefetch=first)
    last = len(chunks) - 1
    return created, [append(conn, job_pk, name, offset, data, final=final, now=now, commit=i == last, prefetched=first)
                     for i, (name, offset, data, final) in enumerate(chunks)]


def append(conn: Connection, job_pk: int, name: str, offset: int, data: bytes, *, final: bool,
           now: dt.datetime, commit: bool = False, prefetched: pg_driver.Query | None = None) -> Appended:
    """Store the new bytes of ``data`` at ``offset``; say whether anything changed and how many bytes are new.

    Ranges in the errors are half-open, ``[lo, hi)``. ``commit`` says nothing follows in
    the transaction (PostgreSQL then commits with the last write, blobs.write).
    ``prefetched`` is this upload's ``prefetch`` if it went with the job's lock.
    """
    end = blobs.end_of(name, offset, data)
    file, overlapping = blobs.find_with_overlapping(conn, job_pk, blobs.LOG, name, offset, end,
                                                    prefetched=prefetched)
    file = file or blobs.new_file(job_pk, blobs.LOG, name, now)
    final_size = file["final_size"]
    if final_size is not None and end > final_size:
        raise _range_conflict(name, max(offset, final_size), end,
                              f"lie past the end it was finalized at ({final_size})")

    new_ranges, pos, held = [], offset, []
    for start, stop, stored in overlapping:
        lo, hi = max(start, offset), min(stop, end)
        if stored[lo - start:hi - start] != data[lo - offset:hi - offset]:
            raise _range_conflict(name, lo, hi, "differ from the bytes already stored there")
        if lo > pos:
            new_ranges.append((pos, lo))
        pos = max(pos, hi)
        held.append((start, stop))
    if pos < end:
        new_ranges.append((pos, end))

    changed = False
    if final and final_size is None:
        if file["stored_end"] > end:
            raise Conflict(f"{name} already holds bytes past offset {end}, where final=1 would end it",
                           file=name)
        file.update(final_size=end, done=True)
        changed = True
    elif final and end != final_size:
        raise Conflict(f"{name} was finalized at {final_size} bytes, not {end}", file=name)
    size, stored_end = file["size"], file["stored_end"]
    if new_ranges:
        for lo, hi in sorted(new_ranges + held):
            if lo <= size:
                size = max(size, hi)
        file["stored_end"] = max(stored_end, end)
        changed = True
    new_bytes = sum(hi - lo for lo, hi in new_ranges)
    if not changed:
        return Appended(False, 0)
    file["updated_at"] = now
    if len(new_ranges) > 1 or (new_ranges and size < stored_end):
        # Bytes go in around chunks already stored, or this upload may have closed a gap
        # and bytes stored beyond it may now join up: one statement per piece, in order.
        for lo, hi in new_ranges:
            blobs.insert_chunk(conn, file["id"], lo, data[lo - offset:hi - offset])
        file["size"] = blobs.contiguous_end(conn, file["id"], size)
        blobs.write(conn, file, end, None, commit=commit)
        return Appended(True, new_bytes)
    # The common case, an upload at the end of what is stored: one write.
    file["size"] = size
    lo, hi = new_ranges[0] if new_ranges else (end, end)
    blobs.write(conn, file, lo, data[lo - offset:hi - offset] if new_ranges else None, commit=commit)
    return Appended(True, new_bytes)


# Revision 0015: the job's lock, and the upload stored if it lands where its file ends.
APPEND_AT_END = pg_driver.statement("collector_append_log_at_end", (
    "SELECT collector_append_log_at_end(%(namespace)s::integer, %(job_id)s::text, %(cluster)s::text, %(key)s::text, "
    "%(offset)s::bigint, %(data)s::bytea, %(now)s::timestamptz) AS file_id"))


def append_at_end(conn: Connection, job_id: str, cluster: str | None, name: str, offset: int, data: bytes, *,
                  now: dt.datetime) -> bool:
    """Store ``data`` and commit, in one round trip, if it is new bytes where the job's file ends (PostgreSQL).

    False when it is not that case, or on SQLite: then nothing was stored, and ``append``
    (after ``jobs.ensure``) applies the general rules. A streamer's uploads after its
    first are this case; the first creates the file, so it goes the general way.
    """
    blobs.end_of(name, offset, data)  # 422 past the largest offset, before anything is sent
    if not data or not is_postgres(conn):
        return False
    (row,) = pg_driver.execute_with_bytes(conn, APPEND_AT_END, {
        "namespace": JOB_LOCK, "job_id": job_id, "cluster": cluster or NO_CLUSTER, "key": blobs.name_key(name),
        "offset": offset, "data": data, "now": now}, commit=True)
    return row["file_id"] is not None


def prefetch(job_id: str, name: str, offset: int, data: bytes) -> pg_driver.Query:
    """What ``append`` reads first, to send with the job's lock (``jobs.ensure``) and hand back to it."""
    return blobs.overlapping_query(job_id, blobs.LOG, name, offset, blobs.end_of(name, offset, data))


def files(conn: Connection, job_pk: int) -> list[blobs.FileRow]:
    """The job's log files with bytes received so far."""
    return blobs.files_of(conn, job_pk, blobs.LOG)


def read(conn: Connection, job_pk: int, name: str, offset: int) -> dict[str, Any]:
    """Up to MAX_READ_BYTES of ``name`` from ``offset``, decoded; ``next_offset`` resumes it.

    An incomplete character at the end is withheld (``next_offset`` stops before it)
    until its bytes arrive, or decodes as U+FFFD once the file is final and complete.
    """
    file = blobs.find_file(conn, job_pk, blobs.LOG, name)
    if file is None:
        raise NotFound(f"no log file {name!r} for this job")
    size = file["size"]
    end = min(size, offset + MAX_READ_BYTES) if offset < size else offset
    raw = blobs.read_range(conn, file["id"], offset, end) if end > offset else b""
    at_eof = file["final_size"] is not None and end >= file["final_size"]
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    text = decoder.decode(raw, final=at_eof)
    pending = len(decoder.getstate()[0])
    return {"file": name, "offset": offset, "next_offset": end - pending, "data": text, "size": size,
            "final": file["done"]}
