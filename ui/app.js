// The page's start: wiring the header, filters and keys, and the live connections. The parts
// are in their own scripts (index.html loads them in order): util.js (shared helpers),
// client.js, live.js, blobs.js, state.js, table.js, clusters.js, detail.js, feed.js.
"use strict";

(function (C) {
  const INTERVAL_KEY = "collector.interval";

  const { el, $, keyOf } = C;
  const S = C.state;
  const route = S.route;

  function onKey(event) {
    if (event.altKey || event.ctrlKey || event.metaKey) return;
    const target = event.target;
    if (target.closest && target.closest("input, select, textarea, [contenteditable]")) return;
    if (event.key !== "ArrowDown" && event.key !== "ArrowUp") return;
    const { rows } = S;
    if (!rows.length) return;
    event.preventDefault();
    const at = route.job ? rows.findIndex((job) => keyOf(job) === keyOf(route.job)) : -1;
    const next = at < 0 ? (event.key === "ArrowDown" ? 0 : rows.length - 1)
      : Math.min(rows.length - 1, Math.max(0, at + (event.key === "ArrowDown" ? 1 : -1)));
    C.selectJob(rows[next]);
    const tr = C.rowElement(keyOf(rows[next]));
    if (tr) tr.scrollIntoView({ block: "nearest" });
  }

  function tick() {
    C.tickRows();
    C.tickDetail();
  }

  function interval() {
    return parseInt($("interval").value, 10) || 0;
  }

  function schedulePoll() {
    clearInterval(S.pollTimer);
    // Open logs and captures follow on the poll interval (the stream carries only events).
    if (interval()) S.pollTimer = setInterval(() => S.tabView && S.tabView.tick(), interval());
  }

  function reconnect() {
    C.loadList();
    if (route.job) C.loadDetail(true);
    S.live.start();
    S.clusterLive.start();
  }

  /** The header's fields show where the page reads now, and that collector's own token. */
  function showConnection() {
    $("api-base").value = C.apiBase();
    $("token").value = C.token();
  }

  /** The page now reads another collector, or with another token. */
  function switched() {
    showConnection();
    reconnect();
  }

  function wire() {
    const apiField = $("api-base");
    const tokenField = $("token");
    showConnection();
    // Typing an address is the viewer's own choice: no question, but the token field shows
    // the token kept for that origin (or none), never the previous collector's.
    apiField.addEventListener("change", () => {
      C.dismissSwitch();
      C.setApiBase(apiField.value);
      switched();
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
      S.live.setInterval(interval());
      S.clusterLive.setInterval(interval());
      schedulePoll();
    });

    const { setFilter, descending } = C;
    const search = $("q");
    search.value = route.q;
    search.addEventListener("input", C.debounce(() => setFilter({ q: search.value.trim() }), 250));
    $("status").addEventListener("change", (e) => setFilter({ status: e.target.value }));
    $("cluster").addEventListener("change", (e) => setFilter({ cluster: e.target.value }));
    $("cluster").addEventListener("blur", C.renderStaleFilters);
    $("status").addEventListener("blur", C.renderStaleFilters);
    $("sort").replaceChildren(...Object.entries(C.SORTS).map(([value, label]) => el("option", { value }, label)));
    $("sort").addEventListener("change", (e) => setFilter({ sort: e.target.value, order: "" }));
    $("order").addEventListener("click", () => setFilter({ order: descending() ? "asc" : "desc" }));
    for (const th of document.querySelectorAll("th[data-sort]")) {
      const button = el("button", { type: "button", class: "sort" }, th.textContent);
      th.replaceChildren(button);
      button.addEventListener("click", () => {
        const sort = th.dataset.sort;
        setFilter(sort === route.sort ? { order: descending() ? "asc" : "desc" } : { sort, order: "" });
      });
    }
    $("prev").addEventListener("click", () => setFilter({ page: Math.max(1, route.page - 1) }));
    $("next").addEventListener("click", () => setFilter({ page: route.page + 1 }));
    document.addEventListener("keydown", onKey);
    // #token= or #api= pasted into the address of the open page: no reload happens, so apply them here.
    window.addEventListener("hashchange", () => {
      if (C.consumeFragment(switched)) switched();
    });
  }

  function start() {
    C.migrateToken();
    C.consumeFragment(switched);
    C.readState();
    C.writeState();
    wire();
    C.renderFilters();
    S.live = new C.Live(C.onEvents, C.onConnection);
    S.live.interval = interval();
    S.clusterLive = new C.ClusterLive(C.onClusters, C.onClusterConnection);
    S.clusterLive.interval = interval();
    C.loadList();
    if (route.job) C.loadDetail(true);
    S.live.start();
    S.clusterLive.start();
    schedulePoll();
    setInterval(tick, 1000);
  }

  document.addEventListener("DOMContentLoaded", start);
})((window.C = window.C || {}));
