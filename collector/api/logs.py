"""``/api/jobs/{job_id}/logs``: streamed log bytes in, tailing text reads out."""

from __future__ import annotations

import datetime as dt

from flask import Blueprint
from flask import Response
from flask import request
from sqlalchemy import Connection

from collector import fanout
from collector import metrics
from collector.api import checked_job_id
from collector.api import parse_body
from collector.api import parse_query
from collector.api import read_body
from collector.api import respond
from collector.api import write_cluster
from collector.api import writer
from collector.api.queries import BlobReadQuery
from collector.api.queries import ClusterQuery
from collector.api.queries import LogUploadQuery
from collector.contract import LegacyLogPayload
from collector.contract import LogContent
from collector.contract import LogFile
from collector.contract import LogFileList
from collector.contract import LogUploadResponse
from collector.db import transaction
from collector.openapi import BINARY
from collector.openapi import JSON
from collector.openapi import RAW
from collector.openapi import operation
from collector.store import jobs as job_store
from collector.store import logs as log_store

bp = Blueprint("logs", __name__, url_prefix="/api/jobs")


@bp.post("/<job_id>/logs")
@operation(query=LogUploadQuery, body={BINARY: RAW, JSON: LegacyLogPayload}, responses={200: LogUploadResponse},
           errors=(409,))
def upload_logs(job_id: str) -> Response:
    """Store log bytes at their source offset (raw body, or the legacy JSON chunk list)."""
    job_id = checked_job_id(job_id)
    now = dt.datetime.now(dt.UTC)
    if request.mimetype == "application/json":
        legacy = parse_body(LegacyLogPayload)
        cluster = (legacy.metadata.cluster if legacy.metadata else None) or parse_query(ClusterQuery).cluster
        chunks = [(c.file, c.offset, c.data.encode(), False) for c in legacy.chunks]
    else:
        query = parse_query(LogUploadQuery)
        cluster = query.cluster
        chunks = [(query.file, query.offset, read_body(), query.final)]
    cluster, credential = write_cluster(cluster), writer()

    created, appended = transaction(
        lambda conn: log_store.upload(conn, job_id, cluster, chunks, now=now, credential=credential), write=True)
    # Counted after the commit: a rolled-back upload (a 409) stored nothing.
    metrics.stored_upload("logs", sum(a.new_bytes for a in appended), created)
    if created:
        fanout.get_hub().poke()  # the placeholder's event
    return respond(LogUploadResponse(job_id=job_id, stored=int(any(a.changed for a in appended))))


@bp.get("/<job_id>/logs")
@operation(query=BlobReadQuery, responses={200: {JSON: (LogFileList, LogContent)}}, errors=(404, 409))
def read_logs(job_id: str) -> Response:
    """Without ``file``, the job's log files; with it, text from ``offset``."""
    job_id = checked_job_id(job_id)
    query = parse_query(BlobReadQuery)

    def read(conn: Connection) -> LogFileList | LogContent:
        job_pk, cluster = job_store.resolve(conn, job_id, query.cluster)
        if query.file is None:
            return LogFileList(job_id=job_id, cluster=cluster, files=[
                LogFile(file=f["name"], size=f["size"], final=f["done"], updated_at=f["updated_at"])
                for f in log_store.files(conn, job_pk)
            ])
        return LogContent(job_id=job_id, **log_store.read(conn, job_pk, query.file, query.offset))

    return respond(transaction(read))
