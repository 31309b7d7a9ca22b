"""The capture outbox: sealed Parquet segments uploaded once to every endpoint, then deleted.

Convention (the one srtctl's Tachometer follows): a segment appears in the outbox only when it
is complete, by ``rename``/``link`` from where it was written. Every ``*.parquet`` directly in
the outbox is therefore taken as final; a writer that must write in place uses a name that does
not end in ``.parquet`` (``out-7.parquet.tmp``) or starts with ``.`` and renames it when done.
As a guard, a segment whose size or mtime changed during its upload is kept and warned about.

Each segment goes to ``POST /api/jobs/{id}/captures?file=&offset=&total=[&cluster=]`` in chunks
of at most 1 MiB; a chunk counts only when the answer has ``next_offset == offset + len`` and
``complete == (end == total)``. The local file is deleted only after every endpoint
acknowledged the whole segment, so a down endpoint keeps it for the next pass.
"""

from __future__ import annotations

import logging
import os

from collector.reporter.chunks import Deadline
from collector.reporter.chunks import read_chunk
from collector.reporter.transport import Transport

log = logging.getLogger("collector.reporter")


def segments(outbox: str) -> dict[str, os.stat_result]:
    """The sealed segments directly in ``outbox``: name to its stat."""
    found: dict[str, os.stat_result] = {}
    try:
        entries = sorted(os.scandir(outbox), key=lambda e: e.name)
    except OSError:
        return found
    for entry in entries:
        if entry.name.endswith(".parquet") and not entry.name.startswith(".") and entry.is_file():
            found[entry.name] = entry.stat()
    return found


class Outbox:
    """Uploads and then removes the segments of one outbox directory."""

    def __init__(self, transport: Transport, job_id: str, directory: str, *, cluster: str | None,
                 chunk_bytes: int) -> None:
        self.transport = transport
        self.job_id = job_id
        self.directory = directory
        self.cluster = cluster
        self.chunk_bytes = chunk_bytes
        # Per endpoint, per segment: the offset acknowledged so far.
        self.progress: dict[str, dict[str, int]] = {e: {} for e in transport.endpoints}
        self.uploaded: list[str] = []

    def flush(self, deadline: Deadline) -> bool:
        """Upload every segment to every endpoint, delete the fully acknowledged; True when none is left."""
        found = segments(self.directory)
        for endpoint in self.transport.endpoints:
            for name, stat in found.items():
                answered = self._upload(endpoint, name, stat.st_size, deadline)
                if answered is None:
                    break  # the endpoint is down or refuses us: leave its other segments for the next pass
        for name, stat in found.items():
            if all(self.progress[e].get(name) == stat.st_size for e in self.transport.endpoints):
                self._remove(name, stat)
        return not segments(self.directory)

    def _upload(self, endpoint: str, name: str, total: int, deadline: Deadline) -> bool | None:
        """Send the rest of one segment: True when complete, False refused, None endpoint failed."""
        done = self.progress[endpoint]
        path = os.path.join(self.directory, name)
        while done.get(name) != total:
            if deadline.passed():
                return None
            offset = done.get(name, 0)
            try:
                data = read_chunk(path, offset, min(self.chunk_bytes, total - offset))
            except OSError as exc:
                log.debug("cannot read %s: %s", path, exc)
                return False
            end = offset + len(data)
            params = {"file": name, "offset": offset, "total": total}
            if self.cluster:
                params["cluster"] = self.cluster
            outcome = self.transport.send_to(endpoint, "POST", f"/api/jobs/{self.job_id}/captures", params=params,
                                             data=data, timeout=deadline.left())
            body = outcome.body or {}
            acknowledged = (outcome.ok and body.get("job_id") == self.job_id and body.get("next_offset") == end
                            and body.get("complete") is (end == total))
            if not acknowledged:
                return None if outcome.endpoint_failed else False
            done[name] = end
        return True

    def _remove(self, name: str, uploaded: os.stat_result) -> None:
        path = os.path.join(self.directory, name)
        try:
            now = os.stat(path)
            if (now.st_size, now.st_mtime_ns) != (uploaded.st_size, uploaded.st_mtime_ns):
                log.warning("%s changed while it was uploaded: kept; segments must be renamed into the outbox "
                            "only when complete", path)
                return
            os.unlink(path)
        except OSError as exc:
            log.debug("cannot remove %s: %s", path, exc)
            return
        for progress in self.progress.values():
            progress.pop(name, None)
        self.uploaded.append(name)
