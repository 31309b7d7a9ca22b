// The jobs table and its filters: paged, searched and sorted by the server, rows patched live.
// Every piece of job data reaches the DOM as text (C.el makes text nodes), never as HTML.
"use strict";

(function (C) {
  const PER_PAGE = 50;
  // The changed-row fade (app.css) repaints the page on every frame while it runs. At 50
  // events/s every row would fade at once, which shows nothing and took the renderer from
  // 36% to 90% of a core (bench/ui.py; 3 rows: 51%): past FLASH_MAX fading rows, changes show unflashed.
  const FLASH_MAX = 3;
  const FLASH_MS = 2000; // the animation's length in app.css

  const { el, $, keyOf } = C;
  const S = C.state;
  const route = S.route;

  C.loadList = async function () {
    const seq = ++S.listSeq;
    const since = S.liveSeq;
    const params = {
      page: route.page, per_page: PER_PAGE, status: route.status, cluster: route.cluster, q: route.q,
      sort: route.sort === "submitted" ? undefined : route.sort, order: route.order,
    };
    let page;
    try {
      page = await C.get("api/jobs", params);
    } catch (error) {
      if (seq === S.listSeq) {
        C.explain(error);
        $("jobs-body").replaceChildren(el("tr", {}, el("td", { colspan: "8", class: "empty" }, "jobs unavailable")));
      }
      return;
    }
    if (seq !== S.listSeq) return; // a newer request is on its way
    C.ok();
    S.listed = page;
    S.rows = page.jobs.map((job) => {
      const live = S.liveJobs.get(keyOf(job));
      return live && live.seq > since ? live.job : job;
    });
    for (const [key, live] of S.liveJobs) {
      if (live.seq <= since) S.liveJobs.delete(key);
    }
    renderTable();
  };

  /** Re-read the page at most every 1.5 s (order and totals may have moved). */
  C.refreshList = C.throttle(C.loadList, 1500);

  function jobRow(job) {
    const selected = route.job && keyOf(route.job) === keyOf(job);
    const open = el("button", { type: "button", class: "job-id", title: "open this job" }, job.job_id);
    const row = el("tr", { "data-key": keyOf(job), "aria-selected": selected ? "true" : "false" },
      el("td", {}, open),
      el("td", { class: "name" }, job.job_name),
      el("td", {}, job.cluster ?? "—"),
      el("td", { class: "state" }, C.statusBadge(job.status), C.queueBadge(job)),
      el("td", {}, job.stage ?? ""),
      el("td", { class: "message" }, job.message ?? ""),
      el("td", { class: "elapsed num" }, C.elapsed(job)),
      el("td", { class: "updated", title: job.updated_at }, C.ago(job.updated_at)));
    row.job = job;
    row.addEventListener("click", () => C.selectJob(job));
    return row;
  }

  function renderTable() {
    const { rows, listed } = S;
    const body = $("jobs-body");
    if (!rows.length) {
      const why = route.q || route.status || route.cluster ? "no jobs match these filters" : "no jobs yet";
      body.replaceChildren(el("tr", {}, el("td", { colspan: "8", class: "empty" }, why)));
    } else {
      body.replaceChildren(...rows.map(jobRow));
    }
    const total = listed ? listed.total : 0;
    const pages = Math.max(1, Math.ceil(total / PER_PAGE));
    const first = rows.length ? (route.page - 1) * PER_PAGE + 1 : 0;
    const last = (route.page - 1) * PER_PAGE + rows.length;
    const count = `${total.toLocaleString()}${listed && listed.total_exact === false ? "+" : ""}`;
    $("range").textContent = `${first.toLocaleString()}–${last.toLocaleString()} of ${count} jobs · page ${route.page} of ${pages.toLocaleString()}${listed && listed.total_exact === false ? "+" : ""}`;
    $("prev").disabled = route.page <= 1;
    $("next").disabled = last >= total && listed.total_exact !== false;
    for (const th of document.querySelectorAll("th[data-sort]")) {
      th.setAttribute("aria-sort", th.dataset.sort === route.sort ? (C.descending() ? "descending" : "ascending") : "none");
    }
    $("order").textContent = C.descending() ? "↓ desc" : "↑ asc";
    $("sort").value = route.sort;
  }

  /** The table row of ``key``; a loop, as no selector can name it (CSS.escape turns the key's NUL into U+FFFD). */
  C.rowElement = function (key) {
    for (const tr of $("jobs-body").children) {
      if (tr.dataset.key === key) return tr;
    }
    return null;
  };

  function flash(row) {
    if (S.flashing >= FLASH_MAX) return;
    S.flashing += 1;
    row.classList.add("changed");
    setTimeout(() => {
      S.flashing -= 1;
    }, FLASH_MS);
  }

  /** Update the rows an event's job is on, from the summary the stream sends. */
  C.patchRow = function (event) {
    const key = keyOf(event);
    S.liveSeq += 1;
    if (event.job) S.liveJobs.set(key, { seq: S.liveSeq, job: event.job });
    const index = S.rows.findIndex((job) => keyOf(job) === key);
    if (index < 0) return false;
    const job = event.job
      ? event.job
      : Object.assign({}, S.rows[index], { status: event.status, stage: event.stage, message: event.message });
    S.rows[index] = job;
    const old = C.rowElement(key);
    if (old) {
      const fresh = jobRow(job);
      flash(fresh);
      old.replaceWith(fresh);
    }
    return true;
  };

  /** Once a second: the rows' elapsed and "ago" times. */
  C.tickRows = function () {
    for (const tr of $("jobs-body").querySelectorAll("tr[data-key]")) {
      const job = tr.job;
      if (!job) continue;
      tr.querySelector(".elapsed").textContent = C.elapsed(job);
      tr.querySelector(".updated").textContent = C.ago(job.updated_at);
    }
  };

  // ------------------------------------------------------------------ filters

  C.renderFilters = function () {
    const clusterCounts = C.sortedClusters();
    const clusterSelect = $("cluster");
    const options = [el("option", { value: "" }, "all clusters")];
    let known = false;
    for (const c of clusterCounts) {
      if (c.cluster === null) continue; // the list cannot filter on "no cluster"
      known = known || c.cluster === route.cluster;
      options.push(el("option", { value: c.cluster }, `${c.cluster} (${c.total.toLocaleString()})`));
    }
    if (route.cluster && !known) options.push(el("option", { value: route.cluster }, `${route.cluster} (0)`));
    clusterSelect.replaceChildren(...options);
    clusterSelect.value = route.cluster;

    // Status counts for the chosen cluster (or all), from the same table.
    const byStatus = {};
    for (const c of clusterCounts) {
      if (route.cluster && c.cluster !== route.cluster) continue;
      for (const [status, n] of Object.entries(c.statuses)) byStatus[status] = (byStatus[status] || 0) + n;
    }
    const statusSelect = $("status");
    statusSelect.replaceChildren(el("option", { value: "" }, "all statuses"),
      ...C.STATUSES.map((s) => el("option", { value: s }, `${C.MARKS[s]} ${s} (${(byStatus[s] || 0).toLocaleString()})`)));
    statusSelect.value = route.status;
  };

  C.setFilter = function (changes) {
    Object.assign(route, changes, { page: changes.page || 1 });
    C.writeState();
    C.renderFilters();
    C.markChosenChip();
    C.loadList();
  };

  // Counts change with every job event: a select being used is not rebuilt under the pointer.
  C.renderFiltersUnlessInUse = function () {
    const active = document.activeElement;
    S.filtersStale = active === $("cluster") || active === $("status");
    if (!S.filtersStale) C.renderFilters();
  };

  C.renderStaleFilters = function () {
    if (S.filtersStale) C.renderFiltersUnlessInUse();
  };
})((window.C = window.C || {}));
