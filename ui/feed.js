// The live feed: every new event, newest first, and where each goes on the page (the table's
// row, the open detail); plus the header's connection state.
"use strict";

(function (C) {
  const FEED_MAX = 200;

  const { el, $, keyOf } = C;
  const S = C.state;

  function feedItem(event) {
    const open = el("button", { type: "button", class: "job-id", title: "open this job" }, event.job_id);
    open.addEventListener("click", () => C.selectJob({ job_id: event.job_id, cluster: event.cluster ?? null }));
    return el("li", { "data-event": event.id },
      el("time", { datetime: event.created_at, title: event.created_at }, C.localTime(event.created_at)), " ",
      open, " ", el("span", { class: "cluster" }, event.cluster ?? "—"), " ", C.statusBadge(event.status), " ",
      el("span", { class: "stage" }, event.stage ?? ""), " ", el("span", { class: "message" }, event.message ?? ""));
  }

  function addToFeed(events) {
    S.pendingFeed.push(...events);
    // One DOM update per frame however fast events come.
    if (!S.feedFrame) S.feedFrame = requestAnimationFrame(flushFeed);
  }

  function flushFeed() {
    S.feedFrame = 0;
    const list = $("feed");
    const fresh = S.pendingFeed.slice(-FEED_MAX).reverse().map(feedItem);
    S.pendingFeed = [];
    const placeholder = list.querySelector(".empty");
    if (placeholder) placeholder.remove();
    list.prepend(...fresh);
    while (list.children.length > FEED_MAX) list.lastElementChild.remove();
  }

  /** New events, from the stream or polling (C.Live). */
  C.onEvents = function (events) {
    addToFeed(events);
    for (const event of events) {
      C.patchRow(event);
      if (S.route.job && keyOf(S.route.job) === keyOf(event)) C.refreshDetail();
    }
    // Order and totals may have moved: re-read the page (at most every 1.5 s). The filters'
    // counts come with the cluster stream.
    C.refreshList();
  };

  C.onConnection = function (mode, text) {
    const pill = $("connection");
    pill.dataset.state = mode;
    pill.textContent = text;
  };
})((window.C = window.C || {}));
