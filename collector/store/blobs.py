"""Large-object tables: a job's blob files and their byte chunks, shared by logs and captures.

A file row holds progress (``size``: bytes contiguous from 0) and state; chunk rows hold
``[start_offset, end_offset)`` of its bytes and never overlap, so any byte range is read
from the primary key alone, touching only the chunks that hold it.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
from collections.abc import Iterator
from typing import Any

from sqlalchemy import Connection
from sqlalchemy import bindparam
from sqlalchemy import insert
from sqlalchemy import select
from sqlalchemy import union_all
from sqlalchemy import update

from collector.contract import MAX_OFFSET
from collector.models import BlobChunk
from collector.models import BlobFile
from collector.store import pg_driver
from collector.store.core import Run
from collector.store.core import table
from collector.store.errors import Unprocessable
from collector.store.identity import is_postgres

LOG = "log"
CAPTURE = "capture"
FILES = table(BlobFile)
CHUNKS = table(BlobChunk)
FileRow = dict[str, Any]

_FILE = select(FILES).where(
    FILES.c.job_pk == bindparam("job_pk"), FILES.c.kind == bindparam("kind"), FILES.c.name_key == bindparam("key")
)
_FILES_OF_JOB = select(FILES).where(FILES.c.job_pk == bindparam("job_pk"), FILES.c.kind == bindparam("kind"))
_chunk_columns = (CHUNKS.c.start_offset, CHUNKS.c.end_offset, CHUNKS.c.data)
_IN_FILE = CHUNKS.c.file_id == bindparam("file_id")
# The chunks overlapping [lo, hi): the one holding lo, then those starting inside the
# range. Each half is a primary-key range scan bounded by the range; the holding one is
# found by its start alone, so a chunk that ends before lo is never read (or detoasted).
_HOLDING_START = (
    select(CHUNKS.c.start_offset).where(_IN_FILE, CHUNKS.c.start_offset <= bindparam("lo"))
    .order_by(CHUNKS.c.start_offset.desc()).limit(1).scalar_subquery()
)
_HOLDING = select(*_chunk_columns).where(
    _IN_FILE, CHUNKS.c.start_offset == _HOLDING_START, CHUNKS.c.end_offset > bindparam("lo")
)
_STARTING_INSIDE = select(*_chunk_columns).where(
    _IN_FILE, CHUNKS.c.start_offset > bindparam("lo"), CHUNKS.c.start_offset < bindparam("hi")
)
_OVERLAPPING = union_all(_HOLDING, _STARTING_INSIDE).subquery()
_OVERLAPPING_ORDERED = select(_OVERLAPPING).order_by(_OVERLAPPING.c.start_offset)
_BOUNDS_AT_OR_AFTER = (
    select(CHUNKS.c.start_offset, CHUNKS.c.end_offset)
    .where(_IN_FILE, CHUNKS.c.start_offset >= bindparam("lo"))
    .order_by(CHUNKS.c.start_offset)
    .limit(1)
)
_FIRST_AT_OR_AFTER = _BOUNDS_AT_OR_AFTER.add_columns(CHUNKS.c.data)
_INSERT_CHUNK = insert(CHUNKS)
_UPDATE_FILE = update(FILES).where(FILES.c.id == bindparam("pk"))
_RECORD_CHECKSUM = update(FILES).where(FILES.c.id == bindparam("pk"), FILES.c.sha256.is_(None))

# PostgreSQL gets an upload's reads and its writes in one round trip each (an upload is
# latency-bound: the reporter waits for each answer). The reads: the file row with the
# chunks overlapping [lo, hi) (found as _OVERLAPPING finds them), one row per chunk, or
# one with null chunk columns when none overlaps.
_FILE_COLUMNS = [c.name for c in FILES.c]
_PROGRESS = ("size", "stored_end", "final_size", "done", "updated_at")  # what an upload moves
_WITH_OVERLAPPING = (
    "SELECT {}, c.start_offset, c.end_offset, c.data FROM {{}} LEFT JOIN LATERAL ("
    "(SELECT start_offset, end_offset, data FROM blob_chunks WHERE file_id = f.id AND start_offset <= %(lo)s "
    "ORDER BY start_offset DESC LIMIT 1) UNION ALL "
    "(SELECT start_offset, end_offset, data FROM blob_chunks WHERE file_id = f.id AND start_offset > %(lo)s "
    "AND start_offset < %(hi)s)) c ON c.end_offset > %(lo)s "
    "WHERE {{}} AND f.kind = %(kind)s AND f.name_key = %(key)s ORDER BY f.job_pk, c.start_offset"
).format(", ".join(f"f.{name}" for name in _FILE_COLUMNS))
FILE_WITH_OVERLAPPING = pg_driver.statement(
    "collector_file_with_overlapping", _WITH_OVERLAPPING.format("blob_files f", "f.job_pk = %(job_pk)s")
)
# The same for every job with the job id: a read that can run before the job's primary
# key is known, in the round trip that takes the job's lock (``overlapping_query``).
FILES_WITH_OVERLAPPING_OF_JOB_ID = pg_driver.statement(
    "collector_files_with_overlapping_of_job_id",
    _WITH_OVERLAPPING.format("jobs j JOIN blob_files f ON f.job_pk = j.id", "j.job_id = %(job_id)s"),
)
# The writes: the file row as it now stands (inserted, or updated: the job's lock is
# held, so nobody else moved it), and the new chunk, if any.
WRITE_FILE_AND_CHUNK = pg_driver.statement("collector_write_file_and_chunk", (
    "WITH file AS (INSERT INTO blob_files (job_pk, kind, name, name_key, size, stored_end, total, final_size, done, "
    "updated_at) VALUES (%(job_pk)s::integer, %(kind)s, %(name)s, %(name_key)s, %(size)s::bigint, "
    "%(stored_end)s::bigint, %(total)s::bigint, %(final_size)s::bigint, %(done)s::boolean, "
    "%(updated_at)s::timestamptz) ON CONFLICT (job_pk, kind, name_key) DO UPDATE SET size = excluded.size, "
    "stored_end = excluded.stored_end, final_size = excluded.final_size, done = excluded.done, "
    "updated_at = excluded.updated_at RETURNING id), "
    "chunk AS (INSERT INTO blob_chunks (file_id, start_offset, end_offset, data) "
    "SELECT id, %(start)s::bigint, %(end)s::bigint, %(data)s::bytea FROM file WHERE %(data)s::bytea IS NOT NULL) "
    "SELECT id FROM file"
))


def end_of(name: str, offset: int, data: bytes) -> int:
    """Where ``data`` at ``offset`` ends; 422 past the largest offset a BIGINT holds."""
    end = offset + len(data)
    if end > MAX_OFFSET:
        raise Unprocessable(f"bytes of {name} at offset {offset} would end at {end}, "
                            f"past the largest offset {MAX_OFFSET}")
    return end


def name_key(name: str) -> str:
    """The unique key of a file name (names run to 4096 characters, past a btree entry)."""
    return hashlib.sha256(name.encode()).hexdigest()


def find_file(conn: Connection, job_pk: int, kind: str, name: str) -> FileRow | None:
    """The file row of ``name``, or None."""
    row = conn.execute(_FILE, {"job_pk": job_pk, "kind": kind, "key": name_key(name)}).mappings().first()
    return None if row is None else dict(row)


def new_file(job_pk: int, kind: str, name: str, now: dt.datetime, *, total: int | None = None) -> FileRow:
    """An empty file row, not stored yet (``id`` None): ``write`` stores it."""
    return {"id": None, "job_pk": job_pk, "kind": kind, "name": name, "name_key": name_key(name), "size": 0,
            "stored_end": 0, "total": total, "final_size": None, "done": False, "sha256": None, "updated_at": now}


def _insert_file(conn: Connection, row: FileRow) -> FileRow:
    values = {key: value for key, value in row.items() if key != "id"}
    row["id"] = conn.execute(insert(FILES).returning(FILES.c.id), values).scalar_one()
    return row


def overlapping_query(job_id: str, kind: str, name: str, lo: int, hi: int) -> pg_driver.Query:
    """``find_with_overlapping`` for any job with ``job_id``, to prefetch under the job's lock (PostgreSQL)."""
    return pg_driver.Query(FILES_WITH_OVERLAPPING_OF_JOB_ID,
                           {"job_id": job_id, "kind": kind, "key": name_key(name), "lo": lo, "hi": hi})


def find_with_overlapping(conn: Connection, job_pk: int, kind: str, name: str, lo: int, hi: int, *,
                          prefetched: pg_driver.Query | None = None,
                          ) -> tuple[FileRow | None, list[tuple[int, int, bytes]]]:
    """The file row of ``name`` (or None) and ``overlapping(lo, hi)`` of it: one round trip on PostgreSQL.

    None at all when ``prefetched`` (an ``overlapping_query`` of the same file and range)
    has run: its rows are the answer.
    """
    if prefetched is not None and prefetched.rows is not None:
        rows = [row for row in prefetched.rows if row["job_pk"] == job_pk]
    elif is_postgres(conn):
        rows = pg_driver.execute(conn, FILE_WITH_OVERLAPPING,
                                 {"job_pk": job_pk, "kind": kind, "key": name_key(name), "lo": lo, "hi": hi})
    else:
        file = find_file(conn, job_pk, kind, name)
        return file, [] if file is None else overlapping(conn, file["id"], lo, hi)
    if not rows:
        return None, []
    file = {name: rows[0][name] for name in _FILE_COLUMNS}
    return file, [(r["start_offset"], r["end_offset"], r["data"]) for r in rows if r["start_offset"] is not None]


def write(conn: Connection, row: FileRow, start: int, data: bytes | None, *, commit: bool = False) -> None:
    """Store the file row as it stands (inserting it if new) and ``data`` at ``start``, if any.

    The caller has checked that no chunk overlaps the new one. ``commit`` says nothing
    follows in the transaction: PostgreSQL then commits in the same round trip.
    """
    if is_postgres(conn):
        params = {**row, "start": start, "end": start + len(data or b""), "data": data}
        (stored,) = pg_driver.execute_with_bytes(conn, WRITE_FILE_AND_CHUNK, params, commit=commit)
        row["id"] = stored["id"]
        return
    if row["id"] is None:
        _insert_file(conn, row)
    else:
        conn.execute(_UPDATE_FILE, {"pk": row["id"], **{name: row[name] for name in _PROGRESS}})
    if data:
        insert_chunk(conn, row["id"], start, data)


def record_checksum(conn: Connection, file_id: int, digest: str) -> None:
    """Store a file's SHA-256 unless it has one (a concurrent seal got there first)."""
    conn.execute(_RECORD_CHECKSUM, {"pk": file_id, "sha256": digest})


def files_of(conn: Connection, job_pk: int, kind: str) -> list[FileRow]:
    """A job's files of one kind, by name in code-point order (the same whatever the database's collation)."""
    rows = conn.execute(_FILES_OF_JOB, {"job_pk": job_pk, "kind": kind}).mappings()
    return sorted((dict(r) for r in rows), key=lambda r: r["name"])


def overlapping(conn: Connection, file_id: int, lo: int, hi: int) -> list[tuple[int, int, bytes]]:
    """``(start, end, data)`` of the chunks holding any byte of ``[lo, hi)``, in order."""
    rows = conn.execute(_OVERLAPPING_ORDERED, {"file_id": file_id, "lo": lo, "hi": hi})
    return [(start, end, bytes(data)) for start, end, data in rows]


def insert_chunk(conn: Connection, file_id: int, start: int, data: bytes) -> None:
    """Store ``data`` at ``start``; the caller has checked that no chunk overlaps it."""
    conn.execute(_INSERT_CHUNK, {"file_id": file_id, "start_offset": start, "end_offset": start + len(data),
                                 "data": data})


def chunk_at_or_after(conn: Connection, file_id: int, pos: int) -> tuple[int, int, bytes] | None:
    """The first chunk starting at or after ``pos``."""
    row = conn.execute(_FIRST_AT_OR_AFTER, {"file_id": file_id, "lo": pos}).first()
    return None if row is None else (row[0], row[1], bytes(row[2]))


def bounds_at_or_after(conn: Connection, file_id: int, pos: int) -> tuple[int, int] | None:
    """``(start, end)`` of the first chunk starting at or after ``pos``, without its bytes."""
    row = conn.execute(_BOUNDS_AT_OR_AFTER, {"file_id": file_id, "lo": pos}).first()
    return None if row is None else (row[0], row[1])


def contiguous_end(conn: Connection, file_id: int, size: int) -> int:
    """How far the bytes run without a gap from ``size`` (a known contiguous end)."""
    while (bounds := bounds_at_or_after(conn, file_id, size)) is not None and bounds[0] == size:
        size = bounds[1]
    return size


def read_range(conn: Connection, file_id: int, lo: int, hi: int) -> bytes:
    """Bytes ``[lo, hi)`` of a file whose bytes are contiguous there."""
    parts = [data[max(lo - start, 0):hi - start] for start, _end, data in overlapping(conn, file_id, lo, hi)]
    return b"".join(parts)


def checksum(conn: Connection, file_id: int) -> str:
    """SHA-256 of a file's bytes, read one chunk at a time."""
    digest, pos = hashlib.sha256(), 0
    while (chunk := chunk_at_or_after(conn, file_id, pos)) is not None:
        digest.update(chunk[2])
        pos = chunk[1]
    return digest.hexdigest()


def stream(run: Run, file_id: int, size: int) -> Iterator[bytes]:
    """A file's bytes up to ``size``, one chunk per short transaction.

    ``run`` is ``Database.run``: a download of any length holds one chunk in memory and no
    database connection between chunks, so a slow client cannot pin the pool.
    """
    pos = 0
    while pos < size:
        chunk = run(functools.partial(chunk_at_or_after, file_id=file_id, pos=pos))
        if chunk is None or chunk[0] != pos:
            return  # deleted while streaming: end short, the client sees Content-Length unmet
        yield chunk[2][: size - pos]
        pos = chunk[1]
