// The page: cluster health chips, jobs table (paged, searched and sorted by the server), detail pane, live feed.
// Every piece of job data reaches the DOM as text (el() makes text nodes), never as HTML.
"use strict";

(function (C) {
  const PER_PAGE = 50;
  const FEED_MAX = 200;
  const STATUSES = ["submitted", "starting", "workers", "frontend", "benchmark", "completed", "failed", "timeout"];
  const FINISHED = new Set(["completed", "failed", "timeout"]);
  // A mark per status, so the state reads without colour.
  const MARKS = {
    submitted: "○", starting: "◔", workers: "◑", frontend: "◕", benchmark: "●",
    completed: "✓", failed: "✗", timeout: "⌛",
  };
  const SORTS = { submitted: "submitted", updated: "updated", job_id: "job id", status: "status", cluster: "cluster" };
  const DEFAULT_DESC = new Set(["submitted", "updated"]);
  const TABS = ["overview", "logs", "tachometer"];
  // A mark per cluster health, so it too reads without colour ("none": no probe ever reported).
  const HEALTH_MARKS = { available: "●", degraded: "◐", unavailable: "✗", none: "○" };
  const INTERVAL_KEY = "collector.interval";

  // ------------------------------------------------------------------ helpers

  /** An element with attributes and children; strings become text nodes. */
  C.el = function (tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value !== undefined && value !== null && value !== false) node.setAttribute(name, value);
    }
    for (const child of children) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  };
  const el = C.el;
  const $ = (id) => document.getElementById(id);

  const keyOf = (job) => `${job.cluster ?? ""}\u0000${job.job_id}`;
  const parseTime = (text) => (text ? Date.parse(text) : NaN);

  function duration(ms) {
    if (!Number.isFinite(ms) || ms < 0) return "";
    let s = Math.floor(ms / 1000);
    const d = Math.floor(s / 86400);
    s -= d * 86400;
    const h = Math.floor(s / 3600);
    s -= h * 3600;
    const m = Math.floor(s / 60);
    s -= m * 60;
    const pad = (n) => String(n).padStart(2, "0");
    if (d) return `${d}d ${pad(h)}h ${pad(m)}m`;
    if (h) return `${h}h ${pad(m)}m ${pad(s)}s`;
    if (m) return `${m}m ${pad(s)}s`;
    return `${s}s`;
  }

  function localTime(text) {
    const t = parseTime(text);
    if (!Number.isFinite(t)) return "";
    const d = new Date(t);
    const pad = (n) => String(n).padStart(2, "0");
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  }

  function ago(text) {
    const t = parseTime(text);
    if (!Number.isFinite(t)) return "";
    const ms = Date.now() - t;
    return ms < 0 ? "just now" : `${duration(ms)} ago`;
  }

  /** Elapsed time: ticking for an active job, fixed once it finished. */
  function elapsed(job) {
    const start = parseTime(job.started_at || job.submitted_at);
    const end = FINISHED.has(job.status) ? parseTime(job.completed_at || job.updated_at) : Date.now();
    return duration(end - start);
  }

  function statusBadge(status) {
    return el("span", { class: `status s-${STATUSES.includes(status) ? status : "other"}` },
      el("span", { class: "mark", "aria-hidden": "true" }, MARKS[status] || "?"), ` ${status}`);
  }

  function debounce(fn, ms) {
    let timer = null;
    return (...args) => {
      clearTimeout(timer);
      timer = setTimeout(() => fn(...args), ms);
    };
  }

  /** ``fn`` at most once per ``ms``, the last call never lost. */
  function throttle(fn, ms) {
    let timer = null;
    let last = 0;
    return () => {
      if (timer) return;
      const wait = Math.max(0, last + ms - Date.now());
      timer = setTimeout(() => {
        timer = null;
        last = Date.now();
        fn();
      }, wait);
    };
  }

  // ------------------------------------------------------------------ state in the URL

  const state = {
    q: "", status: "", cluster: "", page: 1, sort: "submitted", order: "",
    job: null, // {job_id, cluster}
    tab: "overview", file: "",
  };

  function readState() {
    const p = new URLSearchParams(location.search);
    state.q = p.get("q") || "";
    state.status = STATUSES.includes(p.get("status")) ? p.get("status") : "";
    state.cluster = p.get("cluster") || "";
    state.page = Math.max(1, parseInt(p.get("page"), 10) || 1);
    state.sort = SORTS[p.get("sort")] ? p.get("sort") : "submitted";
    state.order = ["asc", "desc"].includes(p.get("order")) ? p.get("order") : "";
    state.job = p.get("job") ? { job_id: p.get("job"), cluster: p.get("job_cluster") || null } : null;
    state.tab = TABS.includes(p.get("tab")) ? p.get("tab") : "overview";
    state.file = p.get("file") || "";
  }

  function writeState() {
    const p = new URLSearchParams();
    if (state.q) p.set("q", state.q);
    if (state.status) p.set("status", state.status);
    if (state.cluster) p.set("cluster", state.cluster);
    if (state.page > 1) p.set("page", state.page);
    if (state.sort !== "submitted") p.set("sort", state.sort);
    if (state.order) p.set("order", state.order);
    if (state.job) {
      p.set("job", state.job.job_id);
      if (state.job.cluster) p.set("job_cluster", state.job.cluster);
      if (state.tab !== "overview") p.set("tab", state.tab);
      if (state.tab === "logs" && state.file) p.set("file", state.file);
    }
    const query = p.toString();
    history.replaceState(null, "", location.pathname + (query ? "?" + query : "") + location.hash);
  }

  const descending = () => (state.order ? state.order === "desc" : DEFAULT_DESC.has(state.sort));

  // ------------------------------------------------------------------ the jobs table

  let rows = []; // the jobs on screen, in order
  let listSeq = 0;
  let listed = null;
  // The newest live summary of each job, numbered as events arrive: a list answer read
  // before an event must not draw that job as it was (under a steady stream many are).
  let liveSeq = 0;
  const liveJobs = new Map();

  async function loadList() {
    const seq = ++listSeq;
    const since = liveSeq;
    const params = {
      page: state.page, per_page: PER_PAGE, status: state.status, cluster: state.cluster, q: state.q,
      sort: state.sort === "submitted" ? undefined : state.sort, order: state.order,
    };
    let page;
    try {
      page = await C.get("api/jobs", params);
    } catch (error) {
      if (seq === listSeq) {
        C.explain(error);
        $("jobs-body").replaceChildren(el("tr", {}, el("td", { colspan: "8", class: "empty" }, "jobs unavailable")));
      }
      return;
    }
    if (seq !== listSeq) return; // a newer request is on its way
    C.ok();
    listed = page;
    rows = page.jobs.map((job) => {
      const live = liveJobs.get(keyOf(job));
      return live && live.seq > since ? live.job : job;
    });
    for (const [key, live] of liveJobs) {
      if (live.seq <= since) liveJobs.delete(key);
    }
    renderTable();
  }

  function jobRow(job) {
    const selected = state.job && keyOf(state.job) === keyOf(job);
    const open = el("button", { type: "button", class: "job-id", title: "open this job" }, job.job_id);
    const row = el("tr", { "data-key": keyOf(job), "aria-selected": selected ? "true" : "false" },
      el("td", {}, open),
      el("td", { class: "name" }, job.job_name),
      el("td", {}, job.cluster ?? "—"),
      el("td", { class: "state" }, statusBadge(job.status), queueBadge(job)),
      el("td", {}, job.stage ?? ""),
      el("td", { class: "message" }, job.message ?? ""),
      el("td", { class: "elapsed num" }, elapsed(job)),
      el("td", { class: "updated", title: job.updated_at }, ago(job.updated_at)));
    row.job = job;
    row.addEventListener("click", () => selectJob(job));
    return row;
  }

  function renderTable() {
    const body = $("jobs-body");
    if (!rows.length) {
      const why = state.q || state.status || state.cluster ? "no jobs match these filters" : "no jobs yet";
      body.replaceChildren(el("tr", {}, el("td", { colspan: "8", class: "empty" }, why)));
    } else {
      body.replaceChildren(...rows.map(jobRow));
    }
    const total = listed ? listed.total : 0;
    const pages = Math.max(1, Math.ceil(total / PER_PAGE));
    const first = rows.length ? (state.page - 1) * PER_PAGE + 1 : 0;
    const last = (state.page - 1) * PER_PAGE + rows.length;
    const count = `${total.toLocaleString()}${listed && listed.total_exact === false ? "+" : ""}`;
    $("range").textContent = `${first.toLocaleString()}–${last.toLocaleString()} of ${count} jobs · page ${state.page} of ${pages.toLocaleString()}${listed && listed.total_exact === false ? "+" : ""}`;
    $("prev").disabled = state.page <= 1;
    $("next").disabled = last >= total && listed.total_exact !== false;
    for (const th of document.querySelectorAll("th[data-sort]")) {
      th.setAttribute("aria-sort", th.dataset.sort === state.sort ? (descending() ? "descending" : "ascending") : "none");
    }
    $("order").textContent = descending() ? "↓ desc" : "↑ asc";
    $("sort").value = state.sort;
  }

  /** The table row of ``key``; a loop, as no selector can name it (CSS.escape turns the key's NUL into U+FFFD). */
  function rowElement(key) {
    for (const tr of $("jobs-body").children) {
      if (tr.dataset.key === key) return tr;
    }
    return null;
  }

  // The changed-row fade (app.css) repaints the page on every frame while it runs. At 50
  // events/s every row would fade at once, which shows nothing and took the renderer from
  // 36% to 90% of a core (bench/ui.py; 3 rows: 51%): past FLASH_MAX fading rows, changes show unflashed.
  const FLASH_MAX = 3;
  const FLASH_MS = 2000; // the animation's length in app.css
  let flashing = 0;

  function flash(row) {
    if (flashing >= FLASH_MAX) return;
    flashing += 1;
    row.classList.add("changed");
    setTimeout(() => {
      flashing -= 1;
    }, FLASH_MS);
  }

  /** Update the rows an event's job is on, from the summary the stream sends. */
  function patchRow(event) {
    const key = keyOf(event);
    liveSeq += 1;
    if (event.job) liveJobs.set(key, { seq: liveSeq, job: event.job });
    const index = rows.findIndex((job) => keyOf(job) === key);
    if (index < 0) return false;
    const job = event.job
      ? event.job
      : Object.assign({}, rows[index], { status: event.status, stage: event.stage, message: event.message });
    rows[index] = job;
    const old = rowElement(key);
    if (old) {
      const fresh = jobRow(job);
      flash(fresh);
      old.replaceWith(fresh);
    }
    return true;
  }

  function tick() {
    for (const tr of $("jobs-body").querySelectorAll("tr[data-key]")) {
      const job = tr.job;
      if (!job) continue;
      tr.querySelector(".elapsed").textContent = elapsed(job);
      tr.querySelector(".updated").textContent = ago(job.updated_at);
    }
    const running = document.querySelector("#detail [data-field=duration]");
    if (running && current && !FINISHED.has(current.status)) running.textContent = durationOf(current);
  }

  // ------------------------------------------------------------------ filters

  function renderFilters() {
    const clusterCounts = sortedClusters();
    const clusterSelect = $("cluster");
    const options = [el("option", { value: "" }, "all clusters")];
    let known = false;
    for (const c of clusterCounts) {
      if (c.cluster === null) continue; // the list cannot filter on "no cluster"
      known = known || c.cluster === state.cluster;
      options.push(el("option", { value: c.cluster }, `${c.cluster} (${c.total.toLocaleString()})`));
    }
    if (state.cluster && !known) options.push(el("option", { value: state.cluster }, `${state.cluster} (0)`));
    clusterSelect.replaceChildren(...options);
    clusterSelect.value = state.cluster;

    // Status counts for the chosen cluster (or all), from the same table.
    const byStatus = {};
    for (const c of clusterCounts) {
      if (state.cluster && c.cluster !== state.cluster) continue;
      for (const [status, n] of Object.entries(c.statuses)) byStatus[status] = (byStatus[status] || 0) + n;
    }
    const statusSelect = $("status");
    statusSelect.replaceChildren(el("option", { value: "" }, "all statuses"),
      ...STATUSES.map((s) => el("option", { value: s }, `${MARKS[s]} ${s} (${(byStatus[s] || 0).toLocaleString()})`)));
    statusSelect.value = state.status;
  }

  function setFilter(changes) {
    Object.assign(state, changes, { page: changes.page || 1 });
    writeState();
    renderFilters();
    markChosenChip();
    loadList();
  }

  // Counts change with every job event: a select being used is not rebuilt under the pointer.
  let filtersStale = false;

  function renderFiltersUnlessInUse() {
    const active = document.activeElement;
    filtersStale = active === $("cluster") || active === $("status");
    if (!filtersStale) renderFilters();
  }

  function renderStaleFilters() {
    if (filtersStale) renderFiltersUnlessInUse();
  }

  // ------------------------------------------------------------------ cluster health

  // Each cluster as GET /api/clusters lists it, by name, kept current by the cluster stream.
  const clusterStates = new Map();
  // Each active job the clusters list, by keyOf(): its phase and Slurm's reason.
  const activeJobs = new Map();
  const dirty = { chips: false, counts: false, jobs: false };
  let clusterFrame = 0;

  /** Code point order with the unknown cluster last, as GET /api/clusters sends them. */
  function sortedClusters() {
    return [...clusterStates.values()].sort((a, b) =>
      a.cluster === null ? 1 : b.cluster === null ? -1 : a.cluster < b.cluster ? -1 : a.cluster > b.cluster ? 1 : 0);
  }

  /** Take cluster states from the stream (one changed cluster) or a GET (``whole``: every cluster). */
  function onClusters(entries, whole) {
    if (whole) {
      const listedNames = new Set(entries.map((entry) => entry.cluster));
      for (const old of [...clusterStates.values()]) {
        if (!listedNames.has(old.cluster)) mergeCluster(old, null);
      }
    }
    for (const entry of entries) mergeCluster(clusterStates.get(entry.cluster), entry);
    // One DOM update per frame, and only of the parts whose data changed.
    if (!clusterFrame) clusterFrame = requestAnimationFrame(flushClusters);
  }

  const chipData = (entry) => entry && JSON.stringify([entry.status, entry.detail, entry.probe_silent, entry.probed_at]);
  const countData = (entry) => entry && JSON.stringify([entry.total, entry.statuses]);
  const jobsData = (entry) => entry && JSON.stringify(entry.active_jobs);
  const selectedActive = () => (state.job ? JSON.stringify(activeJobs.get(keyOf(state.job)) ?? null) : null);

  /** Replace ``old`` with ``entry`` (null: the cluster is gone) and note what must be redrawn. */
  function mergeCluster(old, entry) {
    const name = (entry || old).cluster;
    if (entry) clusterStates.set(name, entry);
    else clusterStates.delete(name);
    dirty.chips = dirty.chips || chipData(old) !== chipData(entry);
    dirty.counts = dirty.counts || countData(old) !== countData(entry);
    if (jobsData(old) === jobsData(entry)) return;
    dirty.jobs = true;
    const before = selectedActive();
    for (const job of old ? old.active_jobs : []) activeJobs.delete(keyOf({ cluster: name, job_id: job.job_id }));
    for (const job of entry ? entry.active_jobs : []) activeJobs.set(keyOf({ cluster: name, job_id: job.job_id }), job);
    // Probe reports carry no job event: the open job's Slurm view is re-read when its entry moves.
    if (selectedActive() !== before) refreshDetail();
  }

  function flushClusters() {
    clusterFrame = 0;
    if (dirty.chips) renderChips();
    if (dirty.counts) renderFiltersUnlessInUse();
    if (dirty.jobs) syncQueueBadges();
    Object.assign(dirty, { chips: false, counts: false, jobs: false });
  }

  function renderChips() {
    $("clusters").replaceChildren(...sortedClusters().filter((entry) => entry.cluster !== null).map(chip));
  }

  /** One cluster: its health by mark and word, the probe's detail in full view, and a filter on click. */
  function chip(entry) {
    const health = entry.status || "none";
    const probed = entry.probed_at ? `probed ${localTime(entry.probed_at)}` : "no probe has reported for this cluster";
    const button = el("button", {
      type: "button", class: "chip", "data-cluster": entry.cluster, "data-health": health,
      "aria-pressed": state.cluster === entry.cluster ? "true" : "false",
      // The detail is on the chip itself (cut by CSS when long); the tooltip holds all of it.
      title: [entry.detail, probed, "click to show only its jobs"].filter(Boolean).join("\n"),
    },
    el("span", { class: "dot", "aria-hidden": "true" }, HEALTH_MARKS[health] || "?"),
    el("span", { class: "name" }, entry.cluster), " ",
    el("span", { class: "health" }, entry.status || "no probe"),
    entry.probe_silent ? el("span", { class: "silent" }, "probe silent") : null,
    entry.detail ? el("span", { class: "detail" }, entry.detail) : null);
    button.addEventListener("click", () => setFilter({ cluster: state.cluster === entry.cluster ? "" : entry.cluster }));
    return button;
  }

  function markChosenChip() {
    for (const button of $("clusters").children) {
      button.setAttribute("aria-pressed", button.dataset.cluster === state.cluster ? "true" : "false");
    }
  }

  function onClusterConnection(mode, text) {
    const line = $("clusters-state");
    line.dataset.state = mode;
    line.textContent = `cluster health ${text}`;
  }

  // Slurm's "no reason" is the word None.
  const reasonOf = (text) => (text && text !== "None" ? text : null);

  /** "queued: Resources" while Slurm holds an active job back (from the clusters' active jobs), else null. */
  function queueBadge(job) {
    const active = activeJobs.get(keyOf(job));
    if (!active || active.phase !== "queued" || FINISHED.has(job.status)) return null;
    const reason = reasonOf(active.reason);
    return el("span", { class: "queue", title: `waiting in Slurm's queue since ${localTime(active.since)}` },
      reason ? `queued: ${reason}` : "queued");
  }

  /** Bring the rows' queue badges up to date in place, touching only those that changed. */
  function syncQueueBadges() {
    for (const tr of $("jobs-body").querySelectorAll("tr[data-key]")) {
      if (!tr.job) continue;
      const cell = tr.querySelector("td.state");
      const old = cell.querySelector(".queue");
      const fresh = queueBadge(tr.job);
      if ((old && old.textContent) === (fresh && fresh.textContent)) continue;
      if (old) old.remove();
      if (fresh) cell.append(fresh);
    }
  }

  /** Slurm's view of the job, as the detail's ``slurm`` has it. */
  function slurmText(slurm) {
    if (!slurm) return "—";
    if (!slurm.state) return `not in Slurm's queue (asked ${localTime(slurm.observed_at)})`;
    const reason = reasonOf(slurm.reason);
    const since = slurm.since ? ` since ${localTime(slurm.since)}` : "";
    const gone = slurm.gone_since ? ` · out of the queue since ${localTime(slurm.gone_since)}` : "";
    return `${slurm.state}${reason ? ` (${reason})` : ""}${since}${gone}`;
  }

  // ------------------------------------------------------------------ the detail pane

  let current = null; // the selected job's detail
  let tabView = null;
  let detailSeq = 0;

  function selectJob(job) {
    const changed = !state.job || keyOf(state.job) !== keyOf(job);
    state.job = { job_id: job.job_id, cluster: job.cluster ?? null };
    if (changed) {
      state.tab = "overview";
      state.file = "";
      current = null;
    }
    writeState();
    for (const tr of $("jobs-body").querySelectorAll("tr[data-key]")) {
      tr.setAttribute("aria-selected", tr.dataset.key === keyOf(state.job) ? "true" : "false");
    }
    loadDetail(changed);
  }

  async function loadDetail(rebuild) {
    if (!state.job) return;
    const seq = ++detailSeq;
    const job = state.job;
    let detail;
    try {
      detail = await C.get(`api/jobs/${encodeURIComponent(job.job_id)}`, { cluster: job.cluster || undefined });
    } catch (error) {
      if (seq !== detailSeq) return;
      if (error.status === 404) {
        $("detail").replaceChildren(el("p", { class: "empty" }, `job ${job.job_id} is not on this collector (any more)`));
        return;
      }
      C.explain(error);
      return;
    }
    if (seq !== detailSeq) return;
    C.ok();
    current = detail;
    renderDetail(rebuild || !tabView);
  }

  function renderDetail(rebuild) {
    const job = current;
    const pane = $("detail");
    if (rebuild || !pane.querySelector(".tabs")) {
      const close = el("button", { type: "button", class: "close", "aria-label": "close the job" }, "×");
      close.addEventListener("click", () => {
        state.job = null;
        current = null;
        tabView = null;
        writeState();
        pane.replaceChildren(el("p", { class: "empty" }, "Select a job (click a row, or use ↑ ↓)."));
        for (const tr of $("jobs-body").querySelectorAll("tr[aria-selected=true]")) tr.setAttribute("aria-selected", "false");
      });
      const tabs = el("div", { class: "tabs", role: "tablist" }, ...TABS.map((name) => {
        const tab = el("button", { type: "button", role: "tab", "data-tab": name }, name);
        tab.addEventListener("click", () => showTab(name));
        return tab;
      }));
      pane.replaceChildren(
        el("header", {}, el("h2", {}, el("span", { class: "job-title" }, job.job_id), " ", statusBadge(job.status)),
          el("div", { class: "subtitle" }, job.job_name, job.cluster ? ` · ${job.cluster}` : ""), close),
        tabs, el("div", { class: "tab-body", id: "tab-body" }));
      tabView = null;
      showTab(state.tab);
    } else {
      pane.querySelector("header h2").replaceChildren(el("span", { class: "job-title" }, job.job_id), " ", statusBadge(job.status));
      if (state.tab === "overview") renderOverview();
    }
  }

  function showTab(name) {
    state.tab = name;
    if (name !== "logs") state.file = "";
    writeState();
    for (const tab of document.querySelectorAll("#detail [role=tab]")) {
      tab.setAttribute("aria-selected", tab.dataset.tab === name ? "true" : "false");
    }
    const body = $("tab-body");
    if (name === "overview") {
      tabView = { tick() {} };
      renderOverview();
    } else if (name === "logs") {
      tabView = new C.LogsTab(body, current, {
        file: state.file,
        onFile: (file) => {
          state.file = file;
          writeState();
        },
      });
    } else {
      tabView = new C.CapturesTab(body, current);
    }
  }

  function durationOf(job) {
    const start = parseTime(job.started_at);
    if (!Number.isFinite(start)) return "not started";
    if (FINISHED.has(job.status)) return duration(parseTime(job.completed_at || job.updated_at) - start);
    return `${duration(Date.now() - start)} (running)`;
  }

  function describe(value) {
    if (value === null || value === undefined || value === "") return "—";
    if (typeof value === "object") {
      return Object.entries(value).filter(([, v]) => v !== null && v !== undefined)
        .map(([k, v]) => `${k}: ${typeof v === "object" ? JSON.stringify(v) : v}`).join(" · ") || "—";
    }
    return String(value);
  }

  function linkOrText(url) {
    if (!url) return "—";
    // Only web links become anchors: a job's text must never become a javascript: URL.
    if (/^https?:\/\//i.test(url)) return el("a", { href: url, rel: "noopener noreferrer", target: "_blank" }, url);
    return url;
  }

  function renderOverview() {
    const job = current;
    const body = $("tab-body");
    if (!body || !job) return;
    const meta = job.metadata || {};
    const model = meta.model && typeof meta.model === "object" ? meta.model : null;
    const fields = [
      ["cluster", job.cluster ?? "—"],
      ["status", statusBadge(job.status)],
      ["stage", job.stage ?? "—"],
      ["message", job.message ?? "—"],
      ["slurm", slurmText(job.slurm)],
      ["exit code", job.exit_code ?? "—"],
      ["duration", durationOf(job), "duration"],
      ["submitted", localTime(job.submitted_at)],
      ["started", localTime(job.started_at) || "—"],
      ["completed", localTime(job.completed_at) || "—"],
      ["model", model ? describe(model) : describe(meta.model)],
      ["resources", describe(meta.resources)],
      ["head node", describe(meta.head_node)],
      ["recipe", job.recipe ?? "—"],
      ["log dir", describe(meta.log_dir)],
      ["logs URL", linkOrText(job.logs_url)],
      ["tags", Array.isArray(meta.tags) ? meta.tags.join(", ") || "—" : describe(meta.tags)],
    ];
    const list = el("dl", { class: "overview" }, ...fields.flatMap(([name, value, field]) => [
      el("dt", {}, name), el("dd", { "data-field": field || name.replace(/ /g, "_") }, value)]));
    let previous = null;
    const events = job.events.map((event) => {
      const at = parseTime(event.created_at);
      const delta = previous === null ? "" : `+${duration(at - previous)}`;
      previous = at;
      return el("tr", { "data-event": event.id }, el("td", { title: event.created_at }, localTime(event.created_at)),
        el("td", { class: "delta num" }, delta), el("td", {}, statusBadge(event.status)),
        el("td", {}, event.stage ?? ""), el("td", { class: "message" }, event.message ?? ""));
    });
    const timeline = el("table", { class: "timeline" },
      el("thead", {}, el("tr", {}, ...["time", "Δ", "status", "stage", "message"].map((t) => el("th", {}, t)))),
      el("tbody", {}, ...events));
    // A re-render (a new event) keeps the raw sections the viewer opened or closed.
    const wasOpen = {};
    for (const section of body.querySelectorAll("details.raw")) wasOpen[section.dataset.name] = section.open;
    const raw = ["metadata", "artifacts", "benchmark_results"].map((name) =>
      el("details", { class: "raw", "data-name": name, open: (wasOpen[name] ?? name === "metadata") ? "" : null },
        el("summary", {}, name), el("pre", {}, JSON.stringify(job[name], null, 2))));
    body.replaceChildren(list, el("h3", {}, "timeline"), timeline, el("h3", {}, "raw"), ...raw);
  }

  // ------------------------------------------------------------------ the live feed

  function feedItem(event) {
    const open = el("button", { type: "button", class: "job-id", title: "open this job" }, event.job_id);
    open.addEventListener("click", () => selectJob({ job_id: event.job_id, cluster: event.cluster ?? null }));
    return el("li", { "data-event": event.id },
      el("time", { datetime: event.created_at, title: event.created_at }, localTime(event.created_at)), " ",
      open, " ", el("span", { class: "cluster" }, event.cluster ?? "—"), " ", statusBadge(event.status), " ",
      el("span", { class: "stage" }, event.stage ?? ""), " ", el("span", { class: "message" }, event.message ?? ""));
  }

  let pendingFeed = [];
  let feedFrame = 0;

  function addToFeed(events) {
    pendingFeed.push(...events);
    // One DOM update per frame however fast events come.
    if (!feedFrame) feedFrame = requestAnimationFrame(flushFeed);
  }

  function flushFeed() {
    feedFrame = 0;
    const list = $("feed");
    const fresh = pendingFeed.slice(-FEED_MAX).reverse().map(feedItem);
    pendingFeed = [];
    const placeholder = list.querySelector(".empty");
    if (placeholder) placeholder.remove();
    list.prepend(...fresh);
    while (list.children.length > FEED_MAX) list.lastElementChild.remove();
  }

  const refreshList = throttle(loadList, 1500);
  const refreshDetail = throttle(() => loadDetail(false), 1000);

  function onEvents(events) {
    addToFeed(events);
    for (const event of events) {
      patchRow(event);
      if (state.job && keyOf(state.job) === keyOf(event)) refreshDetail();
    }
    // Order and totals may have moved: re-read the page (at most every 1.5 s). The filters'
    // counts come with the cluster stream.
    refreshList();
  }

  function onConnection(mode, text) {
    const pill = $("connection");
    pill.dataset.state = mode;
    pill.textContent = text;
  }

  // ------------------------------------------------------------------ keys

  function onKey(event) {
    if (event.altKey || event.ctrlKey || event.metaKey) return;
    const target = event.target;
    if (target.closest && target.closest("input, select, textarea, [contenteditable]")) return;
    if (event.key !== "ArrowDown" && event.key !== "ArrowUp") return;
    if (!rows.length) return;
    event.preventDefault();
    const at = state.job ? rows.findIndex((job) => keyOf(job) === keyOf(state.job)) : -1;
    const next = at < 0 ? (event.key === "ArrowDown" ? 0 : rows.length - 1)
      : Math.min(rows.length - 1, Math.max(0, at + (event.key === "ArrowDown" ? 1 : -1)));
    selectJob(rows[next]);
    const tr = rowElement(keyOf(rows[next]));
    if (tr) tr.scrollIntoView({ block: "nearest" });
  }

  // ------------------------------------------------------------------ start

  let live = null;
  let clusterLive = null;
  let pollTimer = null;

  function interval() {
    return parseInt($("interval").value, 10) || 0;
  }

  function schedulePoll() {
    clearInterval(pollTimer);
    // Open logs and captures follow on the poll interval (the stream carries only events).
    if (interval()) pollTimer = setInterval(() => tabView && tabView.tick(), interval());
  }

  function reconnect() {
    loadList();
    if (state.job) loadDetail(true);
    live.start();
    clusterLive.start();
  }

  function wire() {
    const apiField = $("api-base");
    const tokenField = $("token");
    apiField.value = C.apiBase();
    tokenField.value = C.token();
    apiField.addEventListener("change", () => {
      C.setApiBase(apiField.value);
      reconnect();
    });
    tokenField.addEventListener("change", () => {
      C.setToken(tokenField.value);
      reconnect();
    });
    const stored = (() => {
      try {
        return localStorage.getItem(INTERVAL_KEY);
      } catch (e) {
        return null;
      }
    })();
    if (stored !== null && [...$("interval").options].some((o) => o.value === stored)) $("interval").value = stored;
    $("interval").addEventListener("change", () => {
      try {
        localStorage.setItem(INTERVAL_KEY, $("interval").value);
      } catch (e) {
        // Not remembered; still applies.
      }
      live.setInterval(interval());
      clusterLive.setInterval(interval());
      schedulePoll();
    });

    const search = $("q");
    search.value = state.q;
    search.addEventListener("input", debounce(() => setFilter({ q: search.value.trim() }), 250));
    $("status").addEventListener("change", (e) => setFilter({ status: e.target.value }));
    $("cluster").addEventListener("change", (e) => setFilter({ cluster: e.target.value }));
    $("cluster").addEventListener("blur", renderStaleFilters);
    $("status").addEventListener("blur", renderStaleFilters);
    $("sort").replaceChildren(...Object.entries(SORTS).map(([value, label]) => el("option", { value }, label)));
    $("sort").addEventListener("change", (e) => setFilter({ sort: e.target.value, order: "" }));
    $("order").addEventListener("click", () => setFilter({ order: descending() ? "asc" : "desc" }));
    for (const th of document.querySelectorAll("th[data-sort]")) {
      const button = el("button", { type: "button", class: "sort" }, th.textContent);
      th.replaceChildren(button);
      button.addEventListener("click", () => {
        const sort = th.dataset.sort;
        setFilter(sort === state.sort ? { order: descending() ? "asc" : "desc" } : { sort, order: "" });
      });
    }
    $("prev").addEventListener("click", () => setFilter({ page: Math.max(1, state.page - 1) }));
    $("next").addEventListener("click", () => setFilter({ page: state.page + 1 }));
    document.addEventListener("keydown", onKey);
    // #token= or #api= pasted into the address of the open page: no reload happens, so apply them here.
    window.addEventListener("hashchange", () => {
      if (!C.consumeFragment()) return;
      apiField.value = C.apiBase();
      tokenField.value = C.token();
      reconnect();
    });
  }

  function start() {
    C.consumeFragment();
    readState();
    writeState();
    wire();
    renderFilters();
    live = new C.Live(onEvents, onConnection);
    live.interval = interval();
    clusterLive = new C.ClusterLive(onClusters, onClusterConnection);
    clusterLive.interval = interval();
    loadList();
    if (state.job) loadDetail(true);
    live.start();
    clusterLive.start();
    schedulePoll();
    setInterval(tick, 1000);
  }

  document.addEventListener("DOMContentLoaded", start);
})((window.C = window.C || {}));
