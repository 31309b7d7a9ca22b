// Cluster health: a chip per cluster (health, probe detail, a filter on click), the clusters'
// job counts for the filters, and Slurm's view of active jobs (queue badges, the detail's "slurm").
"use strict";

(function (C) {
  // A mark per cluster health, so it too reads without colour ("none": no probe ever reported).
  const HEALTH_MARKS = { available: "●", degraded: "◐", unavailable: "✗", none: "○" };

  const { el, $, keyOf, localTime } = C;
  const S = C.state;
  const route = S.route;

  /** Code point order with the unknown cluster last, as GET /api/clusters sends them. */
  C.sortedClusters = function () {
    return [...S.clusterStates.values()].sort((a, b) =>
      a.cluster === null ? 1 : b.cluster === null ? -1 : a.cluster < b.cluster ? -1 : a.cluster > b.cluster ? 1 : 0);
  };

  /** Take cluster states from the stream (one changed cluster) or a GET (``whole``: every cluster). */
  C.onClusters = function (entries, whole) {
    if (whole) {
      const listedNames = new Set(entries.map((entry) => entry.cluster));
      for (const old of [...S.clusterStates.values()]) {
        if (!listedNames.has(old.cluster)) mergeCluster(old, null);
      }
    }
    for (const entry of entries) mergeCluster(S.clusterStates.get(entry.cluster), entry);
    // One DOM update per frame, and only of the parts whose data changed.
    if (!S.clusterFrame) S.clusterFrame = requestAnimationFrame(flushClusters);
  };

  const chipData = (entry) => entry && JSON.stringify([entry.status, entry.detail, entry.probe_silent, entry.probed_at]);
  const countData = (entry) => entry && JSON.stringify([entry.total, entry.statuses]);
  const jobsData = (entry) => entry && JSON.stringify(entry.active_jobs);
  const selectedActive = () => (route.job ? JSON.stringify(S.activeJobs.get(keyOf(route.job)) ?? null) : null);

  /** Replace ``old`` with ``entry`` (null: the cluster is gone) and note what must be redrawn. */
  function mergeCluster(old, entry) {
    const { dirty } = S;
    const name = (entry || old).cluster;
    if (entry) S.clusterStates.set(name, entry);
    else S.clusterStates.delete(name);
    dirty.chips = dirty.chips || chipData(old) !== chipData(entry);
    dirty.counts = dirty.counts || countData(old) !== countData(entry);
    if (jobsData(old) === jobsData(entry)) return;
    dirty.jobs = true;
    const before = selectedActive();
    for (const job of old ? old.active_jobs : []) S.activeJobs.delete(keyOf({ cluster: name, job_id: job.job_id }));
    for (const job of entry ? entry.active_jobs : []) S.activeJobs.set(keyOf({ cluster: name, job_id: job.job_id }), job);
    // Probe reports carry no job event: the open job's Slurm view is re-read when its entry moves.
    if (selectedActive() !== before) C.refreshDetail();
  }

  function flushClusters() {
    const { dirty } = S;
    S.clusterFrame = 0;
    if (dirty.chips) renderChips();
    if (dirty.counts) C.renderFiltersUnlessInUse();
    if (dirty.jobs) syncQueueBadges();
    Object.assign(dirty, { chips: false, counts: false, jobs: false });
  }

  function renderChips() {
    $("clusters").replaceChildren(...C.sortedClusters().filter((entry) => entry.cluster !== null).map(chip));
  }

  /** One cluster: its health by mark and word, the probe's detail in full view, and a filter on click. */
  function chip(entry) {
    const health = entry.status || "none";
    const probed = entry.probed_at ? `probed ${localTime(entry.probed_at)}` : "no probe has reported for this cluster";
    const button = el("button", {
      type: "button", class: "chip", "data-cluster": entry.cluster, "data-health": health,
      "aria-pressed": route.cluster === entry.cluster ? "true" : "false",
      // The detail is on the chip itself (cut by CSS when long); the tooltip holds all of it.
      title: [entry.detail, probed, "click to show only its jobs"].filter(Boolean).join("\n"),
    },
    el("span", { class: "dot", "aria-hidden": "true" }, HEALTH_MARKS[health] || "?"),
    el("span", { class: "name" }, entry.cluster), " ",
    el("span", { class: "health" }, entry.status || "no probe"),
    entry.probe_silent ? el("span", { class: "silent" }, "probe silent") : null,
    entry.detail ? el("span", { class: "detail" }, entry.detail) : null);
    button.addEventListener("click", () => C.setFilter({ cluster: route.cluster === entry.cluster ? "" : entry.cluster }));
    return button;
  }

  C.markChosenChip = function () {
    for (const button of $("clusters").children) {
      button.setAttribute("aria-pressed", button.dataset.cluster === route.cluster ? "true" : "false");
    }
  };

  C.onClusterConnection = function (mode, text) {
    const line = $("clusters-state");
    line.dataset.state = mode;
    line.textContent = `cluster health ${text}`;
  };

  // Slurm's "no reason" is the word None.
  const reasonOf = (text) => (text && text !== "None" ? text : null);

  /** "queued: Resources" while Slurm holds an active job back (from the clusters' active jobs), else null. */
  C.queueBadge = function (job) {
    const active = S.activeJobs.get(keyOf(job));
    if (!active || active.phase !== "queued" || C.FINISHED.has(job.status)) return null;
    const reason = reasonOf(active.reason);
    return el("span", { class: "queue", title: `waiting in Slurm's queue since ${localTime(active.since)}` },
      reason ? `queued: ${reason}` : "queued");
  };

  /** Bring the rows' queue badges up to date in place, touching only those that changed. */
  function syncQueueBadges() {
    for (const tr of $("jobs-body").querySelectorAll("tr[data-key]")) {
      if (!tr.job) continue;
      const cell = tr.querySelector("td.state");
      const old = cell.querySelector(".queue");
      const fresh = C.queueBadge(tr.job);
      if ((old && old.textContent) === (fresh && fresh.textContent)) continue;
      if (old) old.remove();
      if (fresh) cell.append(fresh);
    }
  }

  /** Slurm's view of the job, as the detail's ``slurm`` has it. */
  C.slurmText = function (slurm) {
    if (!slurm) return "—";
    if (!slurm.state) return `not in Slurm's queue (asked ${localTime(slurm.observed_at)})`;
    const reason = reasonOf(slurm.reason);
    const since = slurm.since ? ` since ${localTime(slurm.since)}` : "";
    const gone = slurm.gone_since ? ` · out of the queue since ${localTime(slurm.gone_since)}` : "";
    return `${slurm.state}${reason ? ` (${reason})` : ""}${since}${gone}`;
  };
})((window.C = window.C || {}));
