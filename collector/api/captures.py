"""``/api/jobs/{job_id}/captures``: Parquet segments in, verbatim downloads out."""

from __future__ import annotations

import datetime as dt
from urllib.parse import quote

from flask import Blueprint
from flask import Response
from sqlalchemy import Connection

from collector import fanout
from collector import metrics
from collector.api import checked_job_id
from collector.api import parse_query
from collector.api import read_body
from collector.api import respond
from collector.api import write_cluster
from collector.api import writer
from collector.api.queries import BlobReadQuery
from collector.api.queries import CaptureUploadQuery
from collector.contract import CaptureFile
from collector.contract import CaptureFileList
from collector.contract import CaptureUploadResponse
from collector.db import get_db
from collector.db import transaction
from collector.openapi import BINARY
from collector.openapi import JSON
from collector.openapi import RAW
from collector.openapi import operation
from collector.store import blobs
from collector.store import captures as capture_store
from collector.store import jobs as job_store

bp = Blueprint("captures", __name__, url_prefix="/api/jobs")


@bp.post("/<job_id>/captures")
@operation(query=CaptureUploadQuery, body={BINARY: RAW}, responses={200: CaptureUploadResponse}, errors=(409,))
def upload_capture(job_id: str) -> Response:
    """Store one sequential chunk of a capture segment."""
    job_id = checked_job_id(job_id)
    query = parse_query(CaptureUploadQuery)
    cluster, credential = write_cluster(query.cluster), writer()
    data = read_body()
    now = dt.datetime.now(dt.UTC)

    def store(conn: Connection) -> tuple[int, bool, capture_store.Progress]:
        # The segment's file and the chunk at this offset are read with the job's lock, in its round trip.
        first = capture_store.prefetch(job_id, query.file, query.offset, data)
        job_pk, _, created = job_store.ensure(conn, job_id, cluster, now, credential=credential, prefetch=first)
        return job_pk, created, capture_store.append(conn, job_pk, query.file, query.offset, query.total, data,
                                                     now=now, prefetched=first)

    job_pk, created, progress = transaction(store, write=True)
    metrics.stored_upload("captures", progress.new_bytes, created)
    if created:
        fanout.get_hub().poke()  # the placeholder's event
    if progress.completed_now:
        capture_store.seal(get_db().run, job_pk, query.file)
    return respond(CaptureUploadResponse(job_id=job_id, next_offset=progress.next_offset, complete=progress.complete))


@bp.get("/<job_id>/captures")
@operation(query=BlobReadQuery, responses={200: {JSON: CaptureFileList, BINARY: RAW}}, errors=(404, 409))
def read_captures(job_id: str) -> Response:
    """Without ``file``, the job's segments; with it, a complete segment's bytes."""
    job_id = checked_job_id(job_id)
    query = parse_query(BlobReadQuery)
    if query.file is not None:
        return _download(job_id, query.cluster, query.file)

    def listing(conn: Connection) -> CaptureFileList:
        job_pk, cluster = job_store.resolve(conn, job_id, query.cluster)
        return CaptureFileList(job_id=job_id, cluster=cluster, files=[
            CaptureFile(file=f["name"], size=f["size"], complete=f["done"], updated_at=f["updated_at"])
            for f in capture_store.files(conn, job_pk)
        ])

    return respond(transaction(listing))


def _download(job_id: str, cluster: str | None, name: str) -> Response:
    def find(conn: Connection) -> tuple[int, blobs.FileRow]:
        job_pk = job_store.resolve(conn, job_id, cluster)[0]
        return job_pk, capture_store.complete_segment(conn, job_pk, name)

    job_pk, segment = transaction(find)
    if segment["sha256"] is None:
        segment["sha256"] = capture_store.seal(get_db().run, job_pk, name)
    # A chunk per short transaction: memory and pool use stay flat for a segment of any size.
    return Response(
        blobs.stream(get_db().run, segment["id"], segment["size"]),
        mimetype="application/octet-stream",
        headers={
            "Content-Length": str(segment["size"]),
            "X-Checksum-SHA256": segment["sha256"],
            "Content-Disposition": f"attachment; filename*=UTF-8''{quote(name.rsplit('/', 1)[-1])}",
        },
    )
