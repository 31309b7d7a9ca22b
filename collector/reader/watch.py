"""``collector watch``: the full-screen dashboard (Textual) of every cluster's jobs, live.

The collector does the work: one push stream of job events and one of cluster health
replace every per-user ``squeue`` poll. Both streams resume after a drop; the event
stream falls back to polling (and says so in the status line). The jobs table is read
again, at most twice a second, after an event. Network reads run in threads; the
screen only ever waits for the terminal.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any
from typing import ClassVar

from rich.text import Text
from textual import on
from textual import work
from textual.app import App
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable
from textual.widgets import Footer
from textual.widgets import Input
from textual.widgets import RichLog
from textual.widgets import Static

from collector.reader import render
from collector.reader.api import Collector
from collector.reader.api import ReaderError
from collector.reader.api import job_path
from collector.reader.cli import follow_events

PER_PAGE = 50
MAX_PAGE = 100  # the API's largest page
REFRESH_S = 0.5  # the jobs table is read again at most this often after events
LOG_POLL_S = 1.0
LOG_LINES = 10_000  # the log pane keeps this many lines
LOG_START_BYTES = 1024 * 1024  # it starts this far from the end of a file (one read)
CHIP_STYLE = {"available": "green", "degraded": "yellow", "unavailable": "red"}
STATUS_STYLE = {"completed": "green", "failed": "red", "timeout": "red", "submitted": "dim"}


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def elapsed(job: dict[str, Any], now: dt.datetime) -> str:
    """How long the job has run, or ran: from its start (else its submission) to its end (else now)."""
    start = render.parse_time(job.get("started_at")) or render.parse_time(job.get("submitted_at"))
    finished = job.get("status") in render.FINISHED
    end = (render.parse_time(job.get("completed_at")) or render.parse_time(job.get("updated_at"))) if finished else now
    return "-" if start is None or end is None else render.duration((end - start).total_seconds())


class Chips(Static):
    """One chip per cluster: its health, why, and whether its probe went silent."""

    def show(self, clusters: dict[str | None, dict[str, Any]]) -> None:
        text = Text()
        for name, entry in sorted(clusters.items(), key=lambda item: (item[0] is None, item[0] or "")):
            status = entry.get("status")
            chip = f" {name or '(no cluster)'} {status or 'no probe'}"
            if entry.get("probe_silent"):
                chip += " (probe silent)"
            elif entry.get("detail"):
                chip += f": {entry['detail']}"
            text.append(chip + " ", style=f"reverse {CHIP_STYLE.get(status or '', 'white')}")
            text.append("  ")
        self.update(text if clusters else Text("no clusters yet", style="dim"))


class _WatchScreen(Screen[None]):
    """A screen of the dashboard: it reaches the app's collector and its thread-safe calls."""

    @property
    def watch_app(self) -> WatchApp:
        app = self.app
        assert isinstance(app, WatchApp)
        return app


class JobsScreen(_WatchScreen):
    """Cluster chips, the jobs table (newest first, paged, searchable) and the status line."""

    BINDINGS: ClassVar = [
        Binding("j", "cursor_down", "Down", show=False),
        Binding("k", "cursor_up", "Up", show=False),
        Binding("slash", "search", "Search"),
        Binding("escape", "clear_search", "Clear", show=False),
        Binding("n", "page(1)", "Next page"),
        Binding("p", "page(-1)", "Prev page"),
        Binding("r", "reload", "Reload"),
        Binding("q", "app.quit", "Quit"),
    ]

    def compose(self) -> ComposeResult:
        yield Chips(id="chips")
        yield Input(placeholder="search: id, name, recipe or tag (Enter; Esc clears)", id="search")
        yield DataTable(id="jobs", cursor_type="row", zebra_stripes=True)
        yield Static(id="status")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for column in ("job", "name", "cluster", "status", "stage", "message", "elapsed", "updated"):
            table.add_column(column.upper(), key=column)
        self.query_one("#search", Input).display = False
        table.focus()
        self.watch_app.reload()  # once the table has its columns

    def action_cursor_down(self) -> None:
        self.query_one(DataTable).action_cursor_down()

    def action_cursor_up(self) -> None:
        self.query_one(DataTable).action_cursor_up()

    def action_search(self) -> None:
        search = self.query_one("#search", Input)
        search.display = True
        search.focus()

    def action_clear_search(self) -> None:
        search = self.query_one("#search", Input)
        search.value, search.display = "", False
        self.query_one(DataTable).focus()
        self.watch_app.search("")

    @on(Input.Submitted, "#search")
    def searched(self, event: Input.Submitted) -> None:
        self.query_one(DataTable).focus()
        self.watch_app.search(event.value)

    def action_page(self, step: int) -> None:
        self.watch_app.turn_page(step)

    def action_reload(self) -> None:
        self.watch_app.reload()

    @on(DataTable.RowSelected, "#jobs")
    def opened(self, event: DataTable.RowSelected) -> None:
        job_id, cluster = json.loads(str(event.row_key.value))
        self.app.push_screen(JobScreen(job_id, cluster))

    def show(self, listing: dict[str, Any], clusters: dict[str | None, dict[str, Any]]) -> None:
        """Put a page of jobs in the table, keeping the cursor on the same job when it is still there."""
        table = self.query_one(DataTable)
        selected = None
        if table.row_count:
            selected = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        reasons = {(c, j["job_id"]): j for c, entry in clusters.items() for j in entry.get("active_jobs") or []}
        now = _now()
        table.clear()
        for job in listing["jobs"]:
            active = reasons.get((job.get("cluster"), job["job_id"]))
            status = render.status_of(job)
            if active and active.get("phase") == "queued" and active.get("reason"):
                status += f" ({active['reason']})"
            key = json.dumps([job["job_id"], job.get("cluster")])
            table.add_row(job["job_id"], job.get("job_name") or "-", job.get("cluster") or "-",
                          Text(status, style=STATUS_STYLE.get(job.get("status", ""), "")), job.get("stage") or "-",
                          job.get("message") or "", elapsed(job, now), job.get("updated_at") or "-", key=key)
        if selected is not None and selected in {row.value for row in table.rows}:
            table.move_cursor(row=table.get_row_index(selected))


class JobScreen(_WatchScreen):
    """One job: its facts and timeline, and a log pane that tails one of its files."""

    BINDINGS: ClassVar = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("f", "follow", "Follow"),
        Binding("l", "next_file", "Next log"),
        Binding("slash", "filter", "Filter"),
        Binding("a", "ansi", "Colours"),
        Binding("q", "app.quit", "Quit"),
    ]

    def __init__(self, job_id: str, cluster: str | None) -> None:
        super().__init__()
        self.job_id, self.cluster = job_id, cluster
        self.files: list[str] = []
        self.sizes: dict[str, int] = {}
        self.file: str | None = None
        self.lines: list[str] = []
        self.following = True
        self.pattern = ""
        self.colours = not os.environ.get("NO_COLOR")
        self._generation = 0  # a new file or filter starts a new tail; older tails stop

    def compose(self) -> ComposeResult:
        with Horizontal():
            with VerticalScroll(id="facts"):
                yield Static(id="detail")
            yield RichLog(id="log", wrap=False, max_lines=LOG_LINES)
        yield Input(placeholder="show only lines containing (Enter; empty: all)", id="filter")
        yield Static(id="logstatus")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#filter", Input).display = False
        self.load()

    @work(thread=True, exclusive=True, group="detail")
    def load(self) -> None:
        collector = self.watch_app.collector
        try:
            job = collector.get(job_path(self.job_id), {"cluster": self.cluster})
            files = collector.get(job_path(self.job_id, "/logs"), {"cluster": self.cluster})["files"]
        except ReaderError as exc:
            self.watch_app.from_thread(self.query_one("#detail", Static).update, f"cannot read the job: {exc}")
            return
        self.watch_app.from_thread(self.shown, job, {f["file"]: f["size"] for f in files})

    def shown(self, job: dict[str, Any], files: dict[str, int]) -> None:
        self.query_one("#detail", Static).update(render.job_detail(job))
        self.files, self.sizes = list(files), files
        if files and self.file is None:
            self.open_file(self.files[0])
        self.say_status()

    def open_file(self, name: str) -> None:
        self.file, self.lines = name, []
        self.query_one(RichLog).clear()
        self._generation += 1
        self.tail(self._generation, max(self.sizes.get(name, 0) - LOG_START_BYTES, 0))

    @work(thread=True, group="tail")
    def tail(self, generation: int, start: int) -> None:
        """Read the file from ``start``, then (while following) what arrives, once a second.

        A start inside the file drops the line it cuts (and the character, if it cuts one).
        """
        collector, offset, partial = self.watch_app.collector, start, ""
        cut = start > 0
        path = job_path(self.job_id, "/logs")
        while generation == self._generation and self.is_attached:
            try:
                chunk = collector.get(path, {"file": self.file, "offset": offset, "cluster": self.cluster})
            except ReaderError as exc:
                self.watch_app.from_thread(self.say_status, f"log: {exc}")
                time.sleep(LOG_POLL_S)
                continue
            text = partial + chunk["data"]
            *complete, partial = text.split("\n")
            if cut and complete:
                complete, cut = complete[1:], False
            if complete:
                self.watch_app.from_thread(self.add_lines, generation, complete)
            moved = chunk["next_offset"] > offset
            offset = chunk["next_offset"]
            if chunk.get("final") and offset >= chunk["size"]:
                if partial:
                    self.watch_app.from_thread(self.add_lines, generation, [partial])
                self.watch_app.from_thread(self.say_status, "log: final")
                return
            if not moved or offset >= chunk["size"]:
                while not self.following and generation == self._generation and self.is_attached:
                    time.sleep(0.2)
                time.sleep(LOG_POLL_S)

    def add_lines(self, generation: int, lines: list[str]) -> None:
        if generation != self._generation:
            return
        self.lines = (self.lines + lines)[-LOG_LINES:]
        log = self.query_one(RichLog)
        for line in lines[-LOG_LINES:]:  # the pane would drop the rest at once
            if self.pattern.lower() in line.lower():
                log.write(self.styled(line))

    def styled(self, line: str) -> Text:
        text = Text.from_ansi(line)
        return text if self.colours else Text(text.plain)

    def redraw(self) -> None:
        log = self.query_one(RichLog)
        log.clear()
        for line in self.lines:
            if self.pattern.lower() in line.lower():
                log.write(self.styled(line))
        self.say_status()

    def say_status(self, extra: str = "") -> None:
        parts = [f"log {self.file or '(none yet)'}"
                 + (f" ({self.files.index(self.file) + 1} of {len(self.files)}: l for the next)"
                    if self.file in self.files and len(self.files) > 1 else ""),
                 "following" if self.following else "paused (f to follow)",
                 "colours" if self.colours else "no colours"]
        if self.pattern:
            parts.append(f"filter: {self.pattern!r}")
        if extra:
            parts.append(extra)
        self.query_one("#logstatus", Static).update(" | ".join(parts))

    def action_follow(self) -> None:
        self.following = not self.following
        self.say_status()

    def action_next_file(self) -> None:
        if self.files:
            at = self.files.index(self.file) + 1 if self.file in self.files else 0
            self.open_file(self.files[at % len(self.files)])
            self.say_status()

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.display = True
        box.focus()

    def action_ansi(self) -> None:
        self.colours = not self.colours
        self.redraw()

    @on(Input.Submitted, "#filter")
    def filtered(self, event: Input.Submitted) -> None:
        self.pattern = event.value
        event.input.display = False
        self.redraw()


class WatchApp(App[None]):
    """The dashboard: a collector, the filters given on the command line, and what it has read."""

    TITLE = "collector watch"
    CSS = """
    #chips { height: auto; max-height: 3; }
    #jobs { height: 1fr; }
    #status, #logstatus { height: 1; background: $panel; }
    #facts { width: 1fr; min-width: 30; overflow-x: auto; }
    #detail { width: auto; }
    #log { width: 2fr; }
    """

    def __init__(self, collector: Collector, *, clusters: tuple[str, ...] = (), statuses: tuple[str, ...] = ()
                 ) -> None:
        super().__init__()
        self.collector = collector
        self.only_clusters, self.only_statuses = clusters, statuses
        self.query_text = ""
        self.page = 1
        self.total = 0
        self.clusters: dict[str | None, dict[str, Any]] = {}
        self.listing: dict[str, Any] = {"jobs": [], "total": 0}
        self.live = "connecting"
        self._dirty = threading.Event()
        self._stopping = threading.Event()

    def on_mount(self) -> None:
        self.sub_title = self.collector.endpoint
        self.push_screen(JobsScreen())
        self.set_interval(REFRESH_S, self._refresh_if_dirty)
        threading.Thread(target=self._follow_events, name="watch-events", daemon=True).start()
        threading.Thread(target=self._follow_clusters, name="watch-clusters", daemon=True).start()

    def on_unmount(self) -> None:
        self._stopping.set()

    # -- reading ---------------------------------------------------------------------

    def reload(self) -> None:
        """Read the current page again (and the clusters, for their chips and queue reasons)."""
        self._load_page()

    @work(thread=True, exclusive=True, group="page")
    def _load_page(self) -> None:
        try:
            listing = self._page()
            clusters = {c["cluster"]: c for c in self.collector.get("/api/clusters")["clusters"]}
        except ReaderError as exc:
            self.from_thread(self.say, f"cannot read the jobs: {exc}")
            return
        self.from_thread(self._shown, listing, clusters)

    def _page(self) -> dict[str, Any]:
        """The current page: one read with at most one cluster and status, else the lists merged."""
        combos = [(c, s) for c in self.only_clusters or (None,) for s in self.only_statuses or (None,)]
        query = self.query_text or None
        if len(combos) == 1:
            (cluster, status), = combos
            listing: dict[str, Any] = self.collector.get("/api/jobs", {
                "cluster": cluster, "status": status, "q": query, "per_page": PER_PAGE, "page": self.page})
            return listing
        # The API filters on one of each: read each list as far as this page reaches, newest first.
        need, jobs, total = self.page * PER_PAGE, [], 0
        for cluster, status in combos:
            found: list[dict[str, Any]] = []
            for page in range(1, need // MAX_PAGE + 2):
                listing = self.collector.get("/api/jobs", {"cluster": cluster, "status": status, "q": query,
                                                           "per_page": MAX_PAGE, "page": page})
                total += listing["total"] if page == 1 else 0
                found += listing["jobs"]
                if len(listing["jobs"]) < MAX_PAGE or len(found) >= need:
                    break
            jobs += found[:need]
        jobs.sort(key=lambda job: job.get("submitted_at") or "", reverse=True)
        return {"jobs": jobs[need - PER_PAGE:need], "total": total, "page": self.page, "per_page": PER_PAGE}

    def _shown(self, listing: dict[str, Any], clusters: dict[str | None, dict[str, Any]]) -> None:
        self.listing, self.clusters = listing, clusters
        screen = self._jobs_screen()
        if screen is not None:
            screen.show(listing, clusters)
            screen.query_one(Chips).show(clusters)
        self.say()

    def _refresh_if_dirty(self) -> None:
        if self._dirty.is_set():
            self._dirty.clear()
            self.reload()

    def _follow_events(self) -> None:
        # The stream filters on one cluster; with several, every event may touch the page.
        filters = {"cluster": self.only_clusters[0] if len(self.only_clusters) == 1 else None}
        self.from_thread(self._set_live, "live")
        for _event in follow_events(self.collector, None, filters, say=self._said, stopped=self._stopping.is_set):
            self._dirty.set()

    def _follow_clusters(self) -> None:
        while not self._stopping.is_set():
            try:
                for frame in self.collector.stream("/api/clusters/stream"):
                    if self._stopping.is_set():
                        return
                    if frame.event == "cluster-status":
                        entry = json.loads(frame.data)
                        self.from_thread(self._cluster_changed, entry)
            except ReaderError:
                pass  # the collector is away: the event follower says so; the chips catch up on return
            time.sleep(1.0)

    def _cluster_changed(self, entry: dict[str, Any]) -> None:
        self.clusters[entry["cluster"]] = entry
        screen = self._jobs_screen()
        if screen is not None:
            screen.query_one(Chips).show(self.clusters)

    def _said(self, line: str) -> None:
        self.from_thread(self._set_live, "polling" if "polling" in line else "live", line)

    def _set_live(self, state: str, why: str = "") -> None:
        self.live = state if not why else f"{state}: {why}"
        self.say()

    def from_thread(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the app's thread, from a reading thread; nothing once the app has ended."""
        if self._stopping.is_set():
            return
        try:
            self.call_from_thread(fn, *args)
        except RuntimeError:
            self._stopping.set()  # the app has ended

    # -- acting ----------------------------------------------------------------------

    def search(self, text: str) -> None:
        self.query_text, self.page = text.strip(), 1
        self.reload()

    def turn_page(self, step: int) -> None:
        last = max((int(self.listing.get("total", 0)) - 1) // PER_PAGE + 1, 1)
        page = min(max(self.page + step, 1), last)
        if page != self.page:
            self.page = page
            self.reload()

    def say(self, problem: str = "") -> None:
        """The status line: where, which filters, which page, and whether updates are live."""
        screen = self._jobs_screen()
        if screen is None:
            return
        total = int(self.listing.get("total", 0))
        pages = max((total - 1) // PER_PAGE + 1, 1)
        filters = [f"{name} {value}" for name, value in (("cluster", ", ".join(self.only_clusters)),
                                                         ("status", ", ".join(self.only_statuses)),
                                                         ("search", repr(self.query_text) if self.query_text else ""))
                   if value]
        parts = [f"page {self.page}/{pages}, {total} jobs" + (f" ({', '.join(filters)})" if filters else ""),
                 self.live, self.collector.endpoint]
        if problem:
            parts.append(problem)
        screen.query_one("#status", Static).update(" | ".join(parts))

    def _jobs_screen(self) -> JobsScreen | None:
        return next((s for s in self.screen_stack if isinstance(s, JobsScreen)), None)

