// The page's state, in one object: what the URL carries (filters, page, sort, the open job and
// tab) and what the parts of the page keep between events. Every other page script reads and
// writes C.state; none keeps mutable state of its own at the top level.
"use strict";

(function (C) {
  C.SORTS = { submitted: "submitted", updated: "updated", job_id: "job id", status: "status", cluster: "cluster" };
  C.TABS = ["overview", "logs", "tachometer"];
  const DEFAULT_DESC = new Set(["submitted", "updated"]);

  C.state = {
    // In the URL (readState, writeState): a reload or a shared link shows the same view.
    route: {
      q: "", status: "", cluster: "", page: 1, sort: "submitted", order: "",
      job: null, // {job_id, cluster}
      tab: "overview", file: "",
    },

    // The jobs table (table.js).
    rows: [], // the jobs on screen, in order
    listed: null, // the last GET /api/jobs answer drawn
    listSeq: 0, // numbers list requests: only the newest one's answer is drawn
    // The newest live summary of each job, numbered as events arrive: a list answer read
    // before an event must not draw that job as it was (under a steady stream many are).
    liveSeq: 0,
    liveJobs: new Map(),
    flashing: 0, // rows fading after a change
    filtersStale: false, // counts changed while a filter select was in use

    // Cluster health (clusters.js).
    clusterStates: new Map(), // each cluster as GET /api/clusters lists it, by name
    activeJobs: new Map(), // each active job the clusters list, by keyOf(): its phase and Slurm's reason
    dirty: { chips: false, counts: false, jobs: false }, // what the next frame redraws
    clusterFrame: 0,

    // The detail pane (detail.js).
    current: null, // the selected job's detail
    tabView: null, // the open tab: {tick()}
    detailSeq: 0,

    // The live feed (feed.js).
    pendingFeed: [],
    feedFrame: 0,

    // The connections (app.js).
    live: null,
    clusterLive: null,
    pollTimer: null,
  };

  const route = C.state.route;

  C.readState = function () {
    const p = new URLSearchParams(location.search);
    route.q = p.get("q") || "";
    route.status = C.STATUSES.includes(p.get("status")) ? p.get("status") : "";
    route.cluster = p.get("cluster") || "";
    route.page = Math.max(1, parseInt(p.get("page"), 10) || 1);
    route.sort = C.SORTS[p.get("sort")] ? p.get("sort") : "submitted";
    route.order = ["asc", "desc"].includes(p.get("order")) ? p.get("order") : "";
    route.job = p.get("job") ? { job_id: p.get("job"), cluster: p.get("job_cluster") || null } : null;
    route.tab = C.TABS.includes(p.get("tab")) ? p.get("tab") : "overview";
    route.file = p.get("file") || "";
  };

  C.writeState = function () {
    const p = new URLSearchParams();
    if (route.q) p.set("q", route.q);
    if (route.status) p.set("status", route.status);
    if (route.cluster) p.set("cluster", route.cluster);
    if (route.page > 1) p.set("page", route.page);
    if (route.sort !== "submitted") p.set("sort", route.sort);
    if (route.order) p.set("order", route.order);
    if (route.job) {
      p.set("job", route.job.job_id);
      if (route.job.cluster) p.set("job_cluster", route.job.cluster);
      if (route.tab !== "overview") p.set("tab", route.tab);
      if (route.tab === "logs" && route.file) p.set("file", route.file);
    }
    const query = p.toString();
    history.replaceState(null, "", location.pathname + (query ? "?" + query : "") + location.hash);
  };

  C.descending = () => (route.order ? route.order === "desc" : DEFAULT_DESC.has(route.sort));
})((window.C = window.C || {}));
