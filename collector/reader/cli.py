"""The scriptable readers: ``collector jobs``, ``show``, ``logs`` and ``events`` (docs/terminal.md).

Output follows kubectl and gh: a table for people, ``--json`` for scripts (the API's own
JSON). Errors are one line on stderr and exit 1.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any
from typing import TypeVar

import click

from collector.reader import render
from collector.reader.api import ENDPOINT_ENV
from collector.reader.api import Collector
from collector.reader.api import ReaderError
from collector.reader.api import endpoint_from_env
from collector.reader.api import job_path
from collector.reader.api import token_from_env

T = TypeVar("T")
PAGE = 100  # the API's largest page
LOG_READ = 1024 * 1024  # what one GET of a log returns at most
POLL_S = 1.0
TAIL_LINES = 10  # what `logs -f` shows of the file before following, as tail -f
TAIL_BYTES = 64 * 1024


def reader_options(command: Callable[..., T]) -> Callable[..., T]:
    """``--endpoint``; the command receives ``collector``, built from it and the token in the environment."""
    @click.option("--endpoint", default=None, metavar="URL",
                  help=f"The collector's base URL (default: ${ENDPOINT_ENV}, else http://127.0.0.1:8080).")
    @functools.wraps(command)
    def wrapper(*args: Any, endpoint: str | None, **kwargs: Any) -> T:
        # A closed pipe (`collector events | head`) needs nothing here: click's main ends
        # the command with exit 1 and no traceback (tests/test_reader_cli.py).
        try:
            return command(*args, collector=Collector(endpoint or endpoint_from_env(), token_from_env()), **kwargs)
        except ReaderError as exc:
            raise click.ClickException(str(exc)) from None
    return wrapper


def _echo_json(document: Any) -> None:
    click.echo(json.dumps(document, indent=2, ensure_ascii=False))


@click.command()
@reader_options
@click.option("--cluster", default=None, help="Only jobs on this cluster.")
@click.option("--status", default=None, help="Only jobs in this status (submitted, starting, ..., failed).")
@click.option("-q", "--query", "query", default=None, help="Only jobs whose id, name, recipe or a tag contains this.")
@click.option("--limit", type=click.IntRange(1, 100), default=50, show_default=True, help="Jobs per page.")
@click.option("--page", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the API's JSON (GET /api/jobs) as it came.")
def jobs(collector: Collector, cluster: str | None, status: str | None, query: str | None, limit: int, page: int,
         as_json: bool) -> None:
    """List jobs, newest submitted first."""
    listing = collector.get("/api/jobs", {"cluster": cluster, "status": status, "q": query, "per_page": limit,
                                          "page": page})
    if as_json:
        _echo_json(listing)
        return
    click.echo(render.table(render.JOB_HEADERS, render.job_rows(listing["jobs"])))
    shown = len(listing["jobs"])
    if listing["total"] > (page - 1) * limit + shown:
        total = f"{listing['total']}{'' if listing.get('total_exact', True) else '+'}"
        click.echo(f"page {page}, {shown} of {total} jobs; next: --page {page + 1}", err=True)


@click.command()
@reader_options
@click.argument("job_id")
@click.option("--cluster", default=None, help="The job's cluster (needed when its id is on several).")
@click.option("--json", "as_json", is_flag=True, help="Print the API's JSON (GET /api/jobs/JOB_ID) as it came.")
def show(collector: Collector, job_id: str, cluster: str | None, as_json: bool) -> None:
    """One job: its facts, metadata and event timeline."""
    job = collector.get(job_path(job_id), {"cluster": cluster})
    if as_json:
        _echo_json(job)
    else:
        click.echo(render.job_detail(job))


@click.command()
@reader_options
@click.argument("job_id")
@click.argument("file")
@click.option("--cluster", default=None, help="The job's cluster (needed when its id is on several).")
@click.option("-f", "--follow", is_flag=True, help="Keep printing what arrives, until the job finishes.")
@click.option("--from-start", is_flag=True, help="With -f, print the whole file first (default: its last 10 lines).")
def logs(collector: Collector, job_id: str, file: str, cluster: str | None, follow: bool, from_start: bool) -> None:
    """Print a job's streamed log FILE (all of it; with -f its end, then what arrives)."""
    path = job_path(job_id, "/logs")
    offset = 0
    if follow and not from_start:
        files = collector.get(path, {"cluster": cluster})["files"]
        size = next((f["size"] for f in files if f["file"] == file), None)
        if size is None:
            names = ", ".join(f["file"] for f in files) or "none yet"
            raise ReaderError(f"job {job_id} has no log file {file!r} (its files: {names})")
        offset = _tail_start(collector, path, file, cluster, size)
    while True:
        offset, final = _print_log(collector, path, file, cluster, offset)
        if not follow or final:
            return
        job = collector.get(job_path(job_id), {"cluster": cluster})
        if job["status"] in render.FINISHED:
            # The job ended: one last read for what it uploaded before it said so.
            _print_log(collector, path, file, cluster, offset)
            return
        time.sleep(POLL_S)


def _tail_start(collector: Collector, path: str, file: str, cluster: str | None, size: int) -> int:
    """The offset of the file's last ``TAIL_LINES`` lines (within its last 64 KiB)."""
    start = max(size - TAIL_BYTES, 0)
    chunk = collector.get(path, {"file": file, "offset": start, "cluster": cluster})
    text = chunk["data"]
    ends = [i for i, c in enumerate(text) if c == "\n"]
    if text.endswith("\n"):
        ends = ends[:-1]
    if len(ends) < TAIL_LINES:
        return start
    # Counted back from where the read ended: a character cut at ``start`` decodes as U+FFFD,
    # whose length in UTF-8 is not the cut bytes'.
    return int(chunk["next_offset"]) - len(text[ends[-TAIL_LINES] + 1:].encode())


def _print_log(collector: Collector, path: str, file: str, cluster: str | None, offset: int) -> tuple[int, bool]:
    """Print the file from ``offset`` up to what has arrived; the next offset, and whether the file is final."""
    while True:
        chunk = collector.get(path, {"file": file, "offset": offset, "cluster": cluster})
        if chunk["data"]:
            sys.stdout.write(chunk["data"])
            sys.stdout.flush()
        moved = chunk["next_offset"] > offset
        offset = chunk["next_offset"]
        if not moved or offset >= chunk["size"]:
            return offset, bool(chunk.get("final")) and offset >= chunk["size"]


@click.command()
@reader_options
@click.option("-f", "--follow", is_flag=True, help="Keep printing events as they happen (push stream, resumed).")
@click.option("--after", type=click.IntRange(min=0), default=None,
              help="Only events after this id (default: all; with -f, only new ones).")
@click.option("--cluster", default=None, help="Only events of jobs on this cluster.")
@click.option("--job", "job_id", default=None, help="Only events of jobs with this id.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line, as the API gives each event.")
def events(collector: Collector, follow: bool, after: int | None, cluster: str | None, job_id: str | None,
           as_json: bool) -> None:
    """Print the event feed, oldest first, one line per event (tab-separated)."""
    filters = {"cluster": cluster, "job_id": job_id}
    found = follow_events(collector, after, filters) if follow else _pages(collector, after or 0, filters)
    for event in found:
        click.echo(json.dumps(event, ensure_ascii=False) if as_json else render.event_line(event))


def _pages(collector: Collector, after: int, filters: dict[str, str | None]) -> Iterator[dict[str, Any]]:
    """Every event after ``after`` that exists now, page by page."""
    while True:
        page = collector.get("/api/events", {"after": after, "limit": PAGE, **filters})
        yield from page["events"]
        if not page["events"]:
            return
        after = page["next_cursor"]


@click.command()
@reader_options
@click.option("--cluster", "clusters", multiple=True, help="Only jobs of this cluster; repeatable.")
@click.option("--status", "statuses", multiple=True, help="Only jobs in this status; repeatable.")
def watch(collector: Collector, clusters: tuple[str, ...], statuses: tuple[str, ...]) -> None:
    """A full-screen dashboard: cluster health, every job live, a job's timeline and logs (q quits)."""
    from collector.reader.watch import WatchApp  # Textual loads only here

    WatchApp(collector, clusters=clusters, statuses=statuses).run()


def _say(line: str) -> None:
    click.echo(line, err=True)


def follow_events(collector: Collector, after: int | None, filters: dict[str, str | None], *,
                  retries: int = 3, poll_s: float = 2.0, retry_stream_s: float = 30.0,
                  say: Callable[[str], None] = _say, stopped: Callable[[], bool] = lambda: False
                  ) -> Iterator[dict[str, Any]]:
    """Events as they happen, from the push stream, resumed by ``Last-Event-ID`` after a drop.

    After ``retries`` failures in a row to open the stream (the collector is down, or a
    proxy buffers or refuses streams), polls ``/api/events`` every ``poll_s`` instead and
    says so on stderr, trying the stream again every ``retry_stream_s``. Ends once ``stopped()``.
    """
    last, failures = after, 0
    while not stopped():
        try:
            if last is None:
                # The live edge, found before the stream opens: what commits meanwhile, or
                # while the collector is away, is then replayed, never skipped.
                last = _newest(collector, filters)
            for frame in collector.stream("/api/events/stream", filters, last_event_id=last):
                if failures >= retries:
                    say("stream: back; following it again")
                failures = 0
                if frame.event == "job-event" and frame.id is not None:
                    last = frame.id
                    yield json.loads(frame.data)
        except ReaderError as exc:
            failures += 1
            if failures == retries:
                say(f"stream: {exc}; polling /api/events every {poll_s:g} s meanwhile")
        if failures < retries:
            time.sleep(1.0 if failures else 0.1)  # a stream that ended (a restart) is reopened at once
            continue
        deadline = time.monotonic() + retry_stream_s
        while time.monotonic() < deadline and not stopped():
            try:
                if last is None:  # down since the start: the live edge once it answers
                    last = _newest(collector, filters)
                for event in _pages(collector, last, filters):
                    last = event["id"]
                    yield event
            except ReaderError:
                pass  # still down: the stream is tried again when the deadline passes
            time.sleep(poll_s)


def _newest(collector: Collector, filters: dict[str, str | None]) -> int:
    """The newest event's id (0 for none), in about 2 log2(id) one-event reads: a gallop, then a bisection."""
    def any_after(position: int) -> bool:
        return bool(collector.get("/api/events", {"after": position, "limit": 1, **filters})["events"])

    low, high = 0, 1  # an event after low; is there one after high?
    if not any_after(0):
        return 0
    while any_after(high):
        low, high = high, high * 2
    while high - low > 1:  # an event after low, none after high: the newest is in (low, high]
        middle = (low + high) // 2
        low, high = (middle, high) if any_after(middle) else (low, middle)
    return high


