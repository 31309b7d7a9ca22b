"""The ui scenario: the page in a real browser over a large database while events arrive.

    python -m bench.run --only ui --backends postgres

Debian's Chromium (``/usr/bin/chromium``, headless, driven by Playwright for Python; no
browser is ever downloaded) opens the page with ``#token=`` against one gunicorn
instance. Everything is timed in the page with its own clock (``performance.now()``,
zero at navigation start), by a script installed before the page's own:

- first render: navigation start until the first ``#jobs-body`` row is in the DOM and
  the frame that draws it has finished (a task queued from that frame's
  ``requestAnimationFrame`` callback), median of fresh page loads (fresh contexts, so no
  cache and no storage);
- search and page change: the input event (or click) until the new rows are in the DOM
  at a frame (``wait_for_function`` polling on ``requestAnimationFrame``);
- under load: a ``requestAnimationFrame`` loop records every frame's timestamp while a
  paced open-loop writer (a thread here) PUTs ``rate`` lifecycle updates per second to
  the jobs on the page's first page, each appending one event numbered in its message,
  so every event patches a row on screen (the worst case; an event for a job on no
  visible row only reaches the feed). Frame gaps, ``longtask`` entries, the JS heap
  after a forced GC (``--js-flags=--expose-gc``, ``--enable-precise-memory-info``), the
  CPU of every process (``/proc``), and when each event's text reached the live feed and
  its job's row (``Date.now()``, the same clock as the writer's ``time.time()``) give the
  responsiveness figures; a row redrawn with an older update than it already showed is
  a problem. An idle window before the load is the baseline for the frame and CPU figures.

Every wait is bounded; a failure is reported as a problem, never as a figure.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import datetime as dt
import itertools
import math
import os
import statistics
import threading
import time

from bench import seed
from bench import streams
from bench.streams import Paced

CHROMIUM = "/usr/bin/chromium"
# tests/test_ui.py's flags (a browser that talks to nothing but the collector under test),
# plus exact heap figures and a gc() the bench can call before reading them.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--enable-precise-memory-info", "--js-flags=--expose-gc"]
VIEWPORT = {"width": 1500, "height": 900}
WAIT_MS = 30_000
FRAME_MS = 1000 / 60
DROPPED_GAP_MS = 2 * FRAME_MS  # a gap this long means at least one frame was not drawn
LONG_FRAME_MS = 50  # the RAIL budget for a response to input
VISIBLE_JOBS = 50  # the page's PER_PAGE: the writer's jobs are the first page's rows
SHOWN_WITHIN_S = 2.0
MAIN_THREAD = ("Timestamp", "TaskDuration", "ScriptDuration", "LayoutDuration", "RecalcStyleDuration",
               "LayoutCount", "RecalcStyleCount")

# Installed before the page's scripts (add_init_script) in every page the bench opens.
INSTRUMENT = r"""
(() => {
  const b = (window.__bench = { rowAt: null, paintedAt: null, frames: [], recording: false,
                                longtasks: [], longFrames: [], shown: {}, longtaskSupported: false,
                                rowUpdate: {}, reverted: 0, revertLog: [], rowShown: {} });
  const types = (window.PerformanceObserver && PerformanceObserver.supportedEntryTypes) || [];
  b.longtaskSupported = types.includes("longtask");
  if (b.longtaskSupported) {
    new PerformanceObserver((list) => {
      for (const e of list.getEntries()) b.longtasks.push([e.startTime, e.duration]);
    }).observe({ type: "longtask", buffered: true });
  }
  if (types.includes("long-animation-frame")) {
    // What ran in a frame over 50 ms: names the script that made it long.
    new PerformanceObserver((list) => {
      for (const e of list.getEntries()) {
        b.longFrames.push({ start: e.startTime, duration: e.duration, blocking: e.blockingDuration,
          scripts: e.scripts.map((s) => [s.invoker, (s.sourceURL || "").split("/").pop() + ":" +
                                         (s.sourceFunctionName || "?"), s.duration]) });
      }
    }).observe({ type: "long-animation-frame", buffered: true });
  }
  const firstRow = new MutationObserver(() => {
    if (!document.querySelector("#jobs-body tr[data-key]")) return;
    firstRow.disconnect();
    b.rowAt = performance.now();
    // The next frame draws the row; a task queued from its callback runs after that frame.
    requestAnimationFrame(() => setTimeout(() => { b.paintedAt = performance.now(); }, 0));
  });
  firstRow.observe(document, { childList: true, subtree: true });
  document.addEventListener("DOMContentLoaded", () => {
    // When each of the writer's events reached the feed, by the update number in its message.
    new MutationObserver((records) => {
      const now = Date.now();
      for (const record of records) {
        for (const node of record.addedNodes) {
          const message = node.querySelector && node.querySelector(".message");
          const match = message && /· update (\d+)$/.exec(message.textContent);
          if (match && !(match[1] in b.shown)) b.shown[match[1]] = now;
        }
      }
    }).observe(document.getElementById("feed"), { childList: true });
    // A row drawn with an older update than its job's row already showed went back in time
    // (a list answer older than the live events): counted, never expected.
    new MutationObserver((records) => {
      for (const record of records) {
        for (const node of record.addedNodes) {
          if (!node.job) continue;
          const match = /· update (\d+)$/.exec(node.job.message || "");
          const update = match ? Number(match[1]) : -1;
          const before = b.rowUpdate[node.job.job_id];
          if (before !== undefined && update < before) {
            b.reverted += 1;
            if (b.revertLog.length < 5) b.revertLog.push([Math.round(performance.now()), node.job.job_id, before,
                                                          update]);
          }
          b.rowUpdate[node.job.job_id] = update;
          if (match && !(match[1] in b.rowShown)) b.rowShown[match[1]] = Date.now();
        }
      }
    }).observe(document.getElementById("jobs-body"), { childList: true });
  });
  b.record = () => {
    // A loop per window: a stopped loop whose callback is still queued must not join the next one.
    const frames = (b.frames = []);
    const loop = (t) => {
      if (b.frames !== frames || !b.recording) return;
      frames.push(t);
      requestAnimationFrame(loop);
    };
    b.recording = true;
    requestAnimationFrame(loop);
    return performance.now();
  };
  b.stop = () => {
    b.recording = false;
    return b.frames;
  };
  b.heap = () => {
    if (window.gc) window.gc();
    return performance.memory ? performance.memory.usedJSHeapSize : null;
  };
})();
"""

FIRST_NAME = "() => document.querySelector('#jobs-body tr[data-key] td.name')?.textContent || null"
SEARCH = """q => { const box = document.getElementById('q'); box.value = q; const t = performance.now();
                   box.dispatchEvent(new Event('input', { bubbles: true })); return t; }"""
SEARCHED = """q => { const names = [...document.querySelectorAll('#jobs-body tr[data-key] td.name')]
                                .map(td => td.textContent);
                     return names.length > 0 && names.every(n => n.includes(q)) && performance.now(); }"""
NEXT = "() => { const t = performance.now(); document.getElementById('next').click(); return t; }"
CHANGED = """prev => { const name = document.querySelector('#jobs-body tr[data-key] td.name')?.textContent;
                       return name !== undefined && name !== prev && performance.now(); }"""
ROW_SHOWS = """([id, message]) => { for (const tr of document.querySelectorAll('#jobs-body tr[data-key]')) {
                 if (tr.job && tr.job.job_id === id) return tr.querySelector('.message').textContent === message
                   && Date.now(); } return false; }"""
# The page's newest GET /api/jobs: when it was answered, and how long it took.
LIST_REQUEST = """() => { const e = performance.getEntriesByType('resource')
                                  .filter(r => new URL(r.name).pathname.endsWith('/api/jobs')).pop();
                          return e ? [e.responseEnd, e.responseEnd - e.startTime] : null; }"""


class UiFailure(Exception):
    """The browser could not open the page or a bounded wait ran out."""


def missing() -> str | None:
    """Why the scenario cannot run here, or None."""
    if not os.path.exists(CHROMIUM):
        return f"needs Debian's Chromium at {CHROMIUM} (apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401 - only whether it imports
    except ImportError:
        return "needs Playwright for Python (pip install playwright; never `playwright install`)"
    return None


@dataclasses.dataclass
class Frames:
    """requestAnimationFrame timestamps over a window, and what their gaps say."""

    stamps: list[float]

    @property
    def gaps(self) -> list[float]:
        return [b - a for a, b in itertools.pairwise(self.stamps)]

    @property
    def seconds(self) -> float:
        return (self.stamps[-1] - self.stamps[0]) / 1000 if len(self.stamps) > 1 else 0.0

    @property
    def fps(self) -> float:
        return len(self.gaps) / self.seconds if self.seconds else math.nan

    @property
    def dropped_pct(self) -> float:
        """Share of frames that came more than two vsyncs after the previous one."""
        gaps = self.gaps
        return 100 * sum(g > DROPPED_GAP_MS for g in gaps) / len(gaps) if gaps else math.nan

    @property
    def long(self) -> int:
        return sum(g > LONG_FRAME_MS for g in self.gaps)

    @property
    def worst_ms(self) -> float:
        return max(self.gaps, default=math.nan)


@dataclasses.dataclass
class UiRun:
    jobs: int
    rate: float
    seconds: float
    first_row_ms: list[float] = dataclasses.field(default_factory=list)  # drawn
    first_dom_ms: list[float] = dataclasses.field(default_factory=list)  # in the DOM
    list_answer_ms: list[float] = dataclasses.field(default_factory=list)  # the page's GET /api/jobs answered
    search_ms: list[float] = dataclasses.field(default_factory=list)
    page_ms: list[float] = dataclasses.field(default_factory=list)
    search_request_ms: list[float | None] = dataclasses.field(default_factory=list)  # their GET /api/jobs
    page_request_ms: list[float | None] = dataclasses.field(default_factory=list)
    idle: Frames | None = None
    loaded: Frames | None = None
    longtasks: list[list[float]] | None = None  # [start, duration] during the load; None: not exposed
    idle_longtasks: list[list[float]] | None = None  # the same in the idle window
    long_frames: list[dict] = dataclasses.field(default_factory=list)
    heap_before: int | None = None
    heap_after: int | None = None
    nodes_before: int = 0
    nodes_after: int = 0
    paced: Paced | None = None
    shown_lag_s: list[float] = dataclasses.field(default_factory=list)  # feed text - PUT answer, per event
    row_lag_s: list[float] = dataclasses.field(default_factory=list)  # its row in the table - PUT answer
    reverted: int = 0  # rows drawn older than their job's row already was
    last_lag_s: float | None = None  # the last PUT's row updated in the table - its answer
    # The renderer's main thread over the load window (Chrome DevTools Performance.getMetrics):
    # seconds of tasks, of script, of layout and of style recalculation.
    main_thread: dict[str, float] = dataclasses.field(default_factory=dict)
    cpu_idle: dict[str, float] = dataclasses.field(default_factory=dict)
    cpu_loaded: dict[str, float] = dataclasses.field(default_factory=dict)
    problems: list[str] = dataclasses.field(default_factory=list)
    elapsed_s: float = 0.0


# -- the writer ------------------------------------------------------------------


def visible_job(jobs: int, k: int) -> tuple[str, str]:
    """(job id, cluster) of the ``k``-th visible seeded job: the newest first (bench/seed.py's ids)."""
    i = jobs - 1 - k % min(VISIBLE_JOBS, jobs)
    return str(1_000_000 + i), seed.CLUSTERS[i % len(seed.CLUSTERS)]


def update_put(jobs: int, k: int) -> tuple[tuple, str, bytes]:
    """The ``k``-th PUT: the next lifecycle step of a visible job, its message numbered so that
    every PUT appends one event (the triple always changes) and the page's text names it."""
    job_id, cluster = visible_job(jobs, k)
    steps = seed.LIFECYCLE[1:]
    status, stage, message = steps[(k // VISIBLE_JOBS) % len(steps)]
    message = f"{message} · update {k}"
    now = dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z")
    body = (f'{{"status": "{status}", "stage": "{stage}", "message": "{message}", "updated_at": "{now}",'
            f' "metadata": {{"cluster": "{cluster}"}}}}')
    return (job_id, status, stage, message), f"/api/jobs/{job_id}", body.encode()


async def _paced_updates(url: str, token: str, jobs: int, rate: float, duration: float) -> Paced:
    # bench/streams.py's open loop over this scenario's PUTs.
    return await streams.paced(url, token, rate, duration, lambda k: update_put(jobs, k))


# -- CPU -------------------------------------------------------------------------


@dataclasses.dataclass
class Cpu:
    """CPU seconds so far: the browser's processes by kind, the server's, PostgreSQL's, and the
    machine's busy and stolen (by the hypervisor) ticks with the total."""

    at: float
    browser: dict[str, float]
    server: float
    postgres: float
    busy: int
    steal: int
    total: int


def _cpu_now(server_pid: int | None) -> Cpu:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = streams._stat(int(entry))
            if fields:
                parents[int(entry)] = int(fields[1])
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)

    def tree(root: int) -> list[int]:
        out, todo = [], [root]
        while todo:
            pid = todo.pop()
            out.append(pid)
            todo.extend(children.get(pid, []))
        return out

    server = set(tree(server_pid)) if server_pid else set()
    browser: dict[str, float] = {}
    for pid in tree(os.getpid()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                # Chromium's child processes rewrite their command line as one space-separated string.
                argv = f.read().decode(errors="replace").replace("\0", " ").split()
        except OSError:
            continue
        if pid in server or not argv or not argv[0].endswith("/chromium"):
            continue
        kind = next((a.removeprefix("--type=") for a in argv if a.startswith("--type=")), "browser")
        browser[kind] = browser.get(kind, 0.0) + streams.cpu_seconds([pid])
    with open("/proc/stat") as stat:
        ticks = [int(v) for v in stat.readline().split()[1:]]
    busy, total = streams.machine_ticks()
    return Cpu(time.monotonic(), browser, streams.cpu_seconds(sorted(server)), streams.postgres_cpu_seconds(),
               busy, ticks[7], total)


def cpu_share(a: Cpu, b: Cpu) -> dict[str, float]:
    """Per cent of one core from ``a`` to ``b``; the machine's figures per cent of all its cores."""
    wall = max(b.at - a.at, 1e-9)
    share = {f"browser {kind}": 100 * (b.browser.get(kind, 0.0) - a.browser.get(kind, 0.0)) / wall
             for kind in b.browser}
    share["server"] = 100 * (b.server - a.server) / wall
    share["postgres"] = 100 * (b.postgres - a.postgres) / wall
    ticks = max(b.total - a.total, 1)
    share["machine busy"] = 100 * (b.busy - a.busy) / ticks
    share["machine steal"] = 100 * (b.steal - a.steal) / ticks
    return share


# -- the browser -----------------------------------------------------------------


def _metrics(cdp) -> dict[str, float]:
    return {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}


def _new_page(browser, run: UiRun):
    context = browser.new_context(viewport=VIEWPORT, timezone_id="UTC")
    context.set_default_timeout(WAIT_MS)
    context.add_init_script(INSTRUMENT)
    page = context.new_page()
    page.on("pageerror", lambda error: run.problems.append(f"page error: {error}"))
    return context, page


def _open(page, url: str, token: str) -> None:
    page.goto(f"{url}/#token={token}")
    page.wait_for_function("() => window.__bench.paintedAt !== null", polling="raf")


def _load_times(page, run: UiRun) -> None:
    row, painted = page.evaluate("() => [window.__bench.rowAt, window.__bench.paintedAt]")
    run.first_dom_ms.append(row)
    run.first_row_ms.append(painted)
    request = page.evaluate(LIST_REQUEST)
    if request is not None:
        run.list_answer_ms.append(request[0])


def _timed(page, action: str, until: str, action_arg=None, until_arg=None) -> tuple[float, float | None]:
    """ms from ``action`` until ``until`` holds at a frame, and how long the GET /api/jobs it made took."""
    page.evaluate("() => performance.clearResourceTimings()")
    started = page.evaluate(action, action_arg)
    done = page.wait_for_function(until, arg=until_arg, polling="raf").json_value()
    request = page.evaluate(LIST_REQUEST)
    return done - started, request[1] if request else None


def _searches(page, run: UiRun, jobs: int) -> None:
    """Searches for a job's name (each matches a few jobs among all of them), then the next pages."""
    newest = page.evaluate(FIRST_NAME)
    for i in (jobs // 2, jobs // 3, jobs // 5):
        q = f"sweep-{i}"
        shown, request = _timed(page, SEARCH, SEARCHED, q, q)
        run.search_ms.append(shown)
        run.search_request_ms.append(request)
    page.evaluate(SEARCH, "")
    page.wait_for_function("name => document.querySelector('#jobs-body tr[data-key] td.name')?.textContent === name",
                           arg=newest, polling="raf")
    for _ in range(3):
        shown, request = _timed(page, NEXT, CHANGED, None, page.evaluate(FIRST_NAME))
        run.page_ms.append(shown)
        run.page_request_ms.append(request)


def _live(page, run: UiRun, url: str, token: str, idle_s: float, server_pid: int | None) -> None:
    page.wait_for_selector("#connection[data-state=live]")
    run.heap_before = page.evaluate("() => window.__bench.heap()")
    run.nodes_before = page.evaluate("() => document.getElementsByTagName('*').length")
    idle_from = page.evaluate("() => window.__bench.record()")
    cpu = _cpu_now(server_pid)
    page.wait_for_timeout(idle_s * 1000)
    run.cpu_idle = cpu_share(cpu, _cpu_now(server_pid))
    run.idle = Frames(page.evaluate("() => window.__bench.stop()"))

    result: list[Paced] = []
    failed: list[BaseException] = []

    def write() -> None:
        try:
            result.append(asyncio.run(_paced_updates(url, token, run.jobs, run.rate, run.seconds)))
        except BaseException as exc:  # reported below, in this thread
            failed.append(exc)

    cdp = page.context.new_cdp_session(page)
    cdp.send("Performance.enable")
    before = _metrics(cdp)
    load_from = page.evaluate("() => window.__bench.record()")
    cpu = _cpu_now(server_pid)
    writer = threading.Thread(target=write, name="ui-writer", daemon=True)
    writer.start()
    deadline = time.monotonic() + run.seconds + streams.PUT_TIMEOUT + 10
    while writer.is_alive() and time.monotonic() < deadline:
        page.wait_for_timeout(200)  # keeps Playwright's connection served while the writer runs
    writer.join(timeout=max(deadline - time.monotonic(), 0))
    run.cpu_loaded = cpu_share(cpu, _cpu_now(server_pid))
    if failed or not result:
        page.evaluate("() => window.__bench.stop()")
        raise UiFailure(f"the writer failed: {failed[0] if failed else 'it did not finish'}")
    run.paced = paced = result[0]
    last = paced.puts[-1]
    try:
        page.wait_for_function(ROW_SHOWS, arg=[last.key[0], last.key[3]], polling="raf", timeout=10_000)
    except Exception as exc:  # playwright's TimeoutError; the figure is then missing, and said so
        run.problems.append(f"the last PUT's row ({last.key[0]}) did not show it within 10 s: {exc}")
    page.wait_for_timeout(1000)  # a throttled list re-read may still be on its way
    run.loaded = Frames(page.evaluate("() => window.__bench.stop()"))
    after = _metrics(cdp)
    run.main_thread = {name: after[name] - before[name] for name in MAIN_THREAD if name in after}
    run.reverted = page.evaluate("() => window.__bench.reverted")
    if run.reverted:
        log = page.evaluate("() => window.__bench.revertLog")
        run.problems.append(f"{run.reverted} rows were redrawn older than they already were ([ms, job, update "
                            f"shown, update drawn]: {log})")
    bench = page.evaluate("() => ({ shown: window.__bench.shown, rows: window.__bench.rowShown,"
                          " longtasks: window.__bench.longtasks,"
                          " supported: window.__bench.longtaskSupported, frames: window.__bench.longFrames })")
    if bench["supported"]:
        run.longtasks = [t for t in bench["longtasks"] if t[0] >= load_from]
        run.idle_longtasks = [t for t in bench["longtasks"] if idle_from <= t[0] < load_from]
    run.long_frames = [f for f in bench["frames"] if f["start"] >= load_from]
    shown_at = {int(k): v / 1000 for k, v in bench["shown"].items()}
    row_at = {int(k): v / 1000 for k, v in bench["rows"].items()}
    for k, put in enumerate(paced.puts):
        if 200 <= put.status < 300 and k in shown_at:
            run.shown_lag_s.append(shown_at[k] - put.answered_at)
        if 200 <= put.status < 300 and k in row_at:
            run.row_lag_s.append(row_at[k] - put.answered_at)
    if len(paced.puts) - 1 in row_at:
        run.last_lag_s = row_at[len(paced.puts) - 1] - last.answered_at
    lost = sum(1 for k, put in enumerate(paced.puts) if 200 <= put.status < 300 and k not in shown_at)
    if lost:
        run.problems.append(f"{lost} of {len(paced.ok)} events never reached the live feed")
    if paced.non2xx or paced.socket_errors:
        statuses = collections.Counter(p.status for p in paced.puts if not 200 <= p.status < 300)
        run.problems.append(f"writer: {paced.non2xx} non-2xx, {paced.socket_errors} socket errors (statuses: "
                            + ", ".join(f"{status or 'none'} x{n}" for status, n in sorted(statuses.items())) + ")")
    run.heap_after = page.evaluate("() => window.__bench.heap()")
    run.nodes_after = page.evaluate("() => document.getElementsByTagName('*').length")
    if page.get_attribute("#connection", "data-state") != "live":
        run.problems.append(f"the page left the stream: {page.text_content('#connection')}")


def measure(url: str, token: str, *, jobs: int, rate: float, seconds: float, loads: int = 3,
            idle_s: float = 5.0, server_pid: int | None = None) -> UiRun:
    """Open the page ``loads`` times, search and page, then watch it under ``rate`` events/s."""
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    started = time.monotonic()
    run = UiRun(jobs=jobs, rate=rate, seconds=seconds)
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                for n in range(loads):
                    context, page = _new_page(browser, run)
                    try:
                        _open(page, url, token)
                        _load_times(page, run)
                        if n == loads - 1:
                            _searches(page, run, jobs)
                    finally:
                        context.close()
                context, page = _new_page(browser, run)
                try:
                    _open(page, url, token)
                    _live(page, run, url, token, idle_s, server_pid)
                finally:
                    context.close()
            finally:
                browser.close()
    except PlaywrightError as exc:
        raise UiFailure(f"browser: {str(exc).splitlines()[0]}") from exc
    run.elapsed_s = time.monotonic() - started
    return run


# -- the table -------------------------------------------------------------------


def _pct(values: list[float], pct: float) -> float | None:
    ordered = sorted(values)
    return ordered[max(math.ceil(pct / 100 * len(ordered)) - 1, 0)] if ordered else None


def _pct_ms(seconds: list[float], pct: float) -> float:
    """The ``pct`` percentile of some (not no) durations in seconds, in ms."""
    value = _pct(seconds, pct)
    assert value is not None, "no values"
    return value * 1000


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def report(run: UiRun) -> list[tuple[str, float | None, float | None, str]]:
    """The table's rows: (measure, value, what it is compared with, target)."""
    med = statistics.median
    rows: list[tuple[str, float | None, float | None, str]] = []
    loads = len(run.first_row_ms)
    rows.append((f"first table row drawn, ms after navigation, median of {loads} fresh loads "
                 "(vs the page's GET /api/jobs answered)", med(run.first_row_ms),
                 med(run.list_answer_ms) if run.list_answer_ms else None, "<= 2000"))
    rows.append((f"first table row drawn, ms, worst of {loads}", max(run.first_row_ms), None, "-"))
    rows.append((f"search -> matching rows shown, ms, median of {len(run.search_ms)}: the 250 ms debounce, then "
                 "the request (vs the GET /api/jobs?q= alone)", med(run.search_ms), _median(run.search_request_ms),
                 "<= 1000"))
    rows.append((f"next page -> its rows shown, ms, median of {len(run.page_ms)} (vs the GET /api/jobs alone)",
                 med(run.page_ms), _median(run.page_request_ms), "<= 500"))
    idle, loaded = run.idle, run.loaded
    assert idle is not None and loaded is not None, "the report of a run that measured frames"
    rate = f"{run.rate:g} events/s"
    rows.append((f"frames per second under {rate} (vs idle)", loaded.fps, idle.fps, "-"))
    rows.append((f"dropped frames, % of frames more than {DROPPED_GAP_MS:.1f} ms after the last, under {rate} "
                 "(vs idle)", loaded.dropped_pct, idle.dropped_pct, "<= 5"))
    rows.append((f"long frames (> {LONG_FRAME_MS} ms) under {rate}, over {loaded.seconds:.0f} s (vs idle, over "
                 f"{idle.seconds:.0f} s)", loaded.long, idle.long, "-"))
    rows.append((f"longest frame, ms, under {rate} (vs idle)", loaded.worst_ms, idle.worst_ms, "<= 200"))
    if run.longtasks is None:
        rows.append(("long tasks (> 50 ms) under load: not exposed by this browser", None, None, "-"))
    else:
        rows.append((f"long tasks (> 50 ms, PerformanceObserver) under {rate} (vs idle)", len(run.longtasks),
                     len(run.idle_longtasks or []), "-"))
        rows.append((f"longest task, ms, under {rate}", max((t[1] for t in run.longtasks), default=None), None,
                     "-"))
    if run.heap_before is not None and run.heap_after is not None:
        rows.append(("JS heap after GC: growth over the load, MiB (vs before the load)",
                     (run.heap_after - run.heap_before) / 2**20, run.heap_before / 2**20, "<= 5"))
    rows.append(("DOM elements after the load (vs before)", run.nodes_after, run.nodes_before, "-"))
    browser = sorted({k for k in run.cpu_loaded if k.startswith("browser ")} - {"browser renderer"})
    for label, keys in (("the page's renderer process", ["browser renderer"]),
                        ("the rest of Chromium (browser, GPU, network, ... processes)", browser),
                        ("gunicorn (master and workers)", ["server"]),
                        ("PostgreSQL (all its processes)", ["postgres"])):
        rows.append((f"CPU % of one core under {rate}: {label} (vs idle)",
                     sum(run.cpu_loaded.get(k, 0.0) for k in keys), sum(run.cpu_idle.get(k, 0.0) for k in keys), "-"))
    cores = os.cpu_count()
    rows.append((f"machine busy, % of its {cores} cores, under {rate} (vs idle)",
                 run.cpu_loaded.get("machine busy"), run.cpu_idle.get("machine busy"), "-"))
    rows.append((f"machine: stolen by the hypervisor, % of its {cores} cores, under {rate} (vs idle)",
                 run.cpu_loaded.get("machine steal"), run.cpu_idle.get("machine steal"), "-"))
    paced = run.paced
    assert paced is not None, "the report of a run that sent PUTs"
    rows.append((f"paced PUTs: achieved req/s of {run.rate:g}, fresh connections (each one event)",
                 paced.achieved_rate, run.rate, "-"))
    if run.shown_lag_s:
        for pct in (50, 99):
            rows.append((f"event text in the live feed, ms after its PUT answered, p{pct} of "
                         f"{len(run.shown_lag_s):,}", _pct_ms(run.shown_lag_s, pct), None,
                         "-" if pct == 50 else "<= 1000"))
    if run.row_lag_s:
        for pct in (50, 99):
            rows.append((f"event's row updated in the table, ms after its PUT answered, p{pct} of "
                         f"{len(run.row_lag_s):,}", _pct_ms(run.row_lag_s, pct), None,
                         "-" if pct == 50 else "<= 1000"))
    rows.append(("last PUT's job updated in the table, s after its answer", run.last_lag_s, None,
                 f"<= {SHOWN_WITHIN_S:g}"))
    rows.append(("table rows redrawn older than their job's row already was (a list answer behind the events)",
                 run.reverted, None, "0"))
    return rows


def notes(run: UiRun) -> list[str]:
    """Detail printed under the table."""
    out = [f"- ui: {run.jobs:,} jobs, first loads " + ", ".join(f"{v:.0f}" for v in run.first_row_ms)
           + " ms (rows in the DOM at " + ", ".join(f"{v:.0f}" for v in run.first_dom_ms) + " ms); searches "
           + ", ".join(f"{v:.0f}" for v in run.search_ms) + " ms; pages " + ", ".join(f"{v:.0f}" for v in run.page_ms)
           + " ms"]
    if run.long_frames:
        worst = sorted(run.long_frames, key=lambda f: -f["duration"])[:3]
        out.append("- ui: longest animation frames under load: " + "; ".join(
            f"{f['duration']:.0f} ms (blocking {f['blocking']:.0f}): "
            + (", ".join(f"{s[0]} {s[1]} {s[2]:.0f} ms" for s in f["scripts"][:2]) or "no script") for f in worst))
    mt = run.main_thread
    if mt.get("Timestamp"):
        wall = mt["Timestamp"]
        out.append(f"- ui: the renderer's main thread under load (DevTools metrics, wall time, so a thread waiting "
                   f"for a core counts): busy {100 * mt['TaskDuration'] / wall:.0f}% of {wall:.0f} s, script "
                   f"{100 * mt['ScriptDuration'] / wall:.1f}%, layout {100 * mt['LayoutDuration'] / wall:.1f}% "
                   f"({mt['LayoutCount']:.0f} layouts), style {100 * mt['RecalcStyleDuration'] / wall:.1f}%")
    out.append(f"- ui scenario: {run.elapsed_s:.0f} s, {run.rate:g} PUTs/s for {run.seconds:g} s")
    return out
