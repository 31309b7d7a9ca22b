// The detail pane: the selected job's overview (fields, timeline, raw documents) and its
// logs and tachometer tabs (blobs.js).
"use strict";

(function (C) {
  const { el, $, keyOf, statusBadge, parseTime, duration, localTime } = C;
  const S = C.state;
  const route = S.route;

  C.selectJob = function (job) {
    const changed = !route.job || keyOf(route.job) !== keyOf(job);
    route.job = { job_id: job.job_id, cluster: job.cluster ?? null };
    if (changed) {
      route.tab = "overview";
      route.file = "";
      S.current = null;
    }
    C.writeState();
    for (const tr of $("jobs-body").querySelectorAll("tr[data-key]")) {
      tr.setAttribute("aria-selected", tr.dataset.key === keyOf(route.job) ? "true" : "false");
    }
    C.loadDetail(changed);
  };

  C.loadDetail = async function (rebuild) {
    if (!route.job) return;
    const seq = ++S.detailSeq;
    const job = route.job;
    let detail;
    const params = { cluster: job.cluster || undefined };
    const path = `api/jobs/${encodeURIComponent(job.job_id)}`;
    // The job's webhook deliveries beside it; a collector without them still shows the job.
    const sent = C.get(`${path}/deliveries`, params).then((found) => found.deliveries, () => []);
    try {
      detail = await C.get(path, params);
      detail.deliveries = await sent;
    } catch (error) {
      if (seq !== S.detailSeq) return;
      if (error.status === 404) {
        $("detail").replaceChildren(el("p", { class: "empty" }, `job ${job.job_id} is not on this collector (any more)`));
        return;
      }
      C.explain(error);
      return;
    }
    if (seq !== S.detailSeq) return;
    C.ok();
    S.current = detail;
    renderDetail(rebuild || !S.tabView);
  };

  /** Re-read the open job at most once a second (an event of it, or its Slurm view moved). */
  C.refreshDetail = C.throttle(() => C.loadDetail(false), 1000);

  function renderDetail(rebuild) {
    const job = S.current;
    const pane = $("detail");
    if (rebuild || !pane.querySelector(".tabs")) {
      const close = el("button", { type: "button", class: "close", "aria-label": "close the job" }, "×");
      close.addEventListener("click", () => {
        route.job = null;
        S.current = null;
        S.tabView = null;
        C.writeState();
        pane.replaceChildren(el("p", { class: "empty" }, "Select a job (click a row, or use ↑ ↓)."));
        for (const tr of $("jobs-body").querySelectorAll("tr[aria-selected=true]")) tr.setAttribute("aria-selected", "false");
      });
      const tabs = el("div", { class: "tabs", role: "tablist" }, ...C.TABS.map((name) => {
        const tab = el("button", { type: "button", role: "tab", "data-tab": name }, name);
        tab.addEventListener("click", () => showTab(name));
        return tab;
      }));
      pane.replaceChildren(
        el("header", {}, el("h2", {}, el("span", { class: "job-title" }, job.job_id), " ", statusBadge(job.status)),
          el("div", { class: "subtitle" }, job.job_name, job.cluster ? ` · ${job.cluster}` : ""), close),
        tabs, el("div", { class: "tab-body", id: "tab-body" }));
      S.tabView = null;
      showTab(route.tab);
    } else {
      pane.querySelector("header h2").replaceChildren(el("span", { class: "job-title" }, job.job_id), " ", statusBadge(job.status));
      if (route.tab === "overview") renderOverview();
    }
  }

  function showTab(name) {
    route.tab = name;
    if (name !== "logs") route.file = "";
    C.writeState();
    for (const tab of document.querySelectorAll("#detail [role=tab]")) {
      tab.setAttribute("aria-selected", tab.dataset.tab === name ? "true" : "false");
    }
    const body = $("tab-body");
    if (name === "overview") {
      S.tabView = { tick() {} };
      renderOverview();
    } else if (name === "logs") {
      S.tabView = new C.LogsTab(body, S.current, {
        file: route.file,
        onFile: (file) => {
          route.file = file;
          C.writeState();
        },
      });
    } else {
      S.tabView = new C.CapturesTab(body, S.current);
    }
  }

  function durationOf(job) {
    const start = parseTime(job.started_at);
    if (!Number.isFinite(start)) return "not started";
    if (C.FINISHED.has(job.status)) return duration(parseTime(job.completed_at || job.updated_at) - start);
    return `${duration(Date.now() - start)} (running)`;
  }

  /** Once a second: the open job's duration while it runs. */
  C.tickDetail = function () {
    const running = document.querySelector("#detail [data-field=duration]");
    if (running && S.current && !C.FINISHED.has(S.current.status)) running.textContent = durationOf(S.current);
  };

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

  /** Who wrote an event ("by b200-writer": the credential's name, as text), after its message; nothing when unknown. */
  function writer(event) {
    if (event.credential === null || event.credential === undefined || event.credential === "") return [];
    return [event.message ? " " : null, el("span", { class: "by" }, `by ${event.credential}`)];
  }

  /** How a webhook delivery stands, in words: sent, retrying (tries so far, next try) or given up. */
  function deliveryState(delivery) {
    if (delivery.state === "sent") return `sent ${localTime(delivery.sent_at)}`;
    const tries = `${delivery.attempts} ${delivery.attempts === 1 ? "try" : "tries"}`;
    const answer = delivery.last_status === null ? "no answer" : `answered ${delivery.last_status}`;
    if (delivery.state === "dead") return `gave up after ${tries} (${answer})`;
    if (delivery.attempts === 0) return "sending";
    return `retrying: ${tries}, ${answer}; next ${localTime(delivery.next_attempt_at)}`;
  }

  /** The job's webhook deliveries, when a subscription wanted any of its events. */
  function notifications(deliveries) {
    if (!deliveries.length) return [];
    const rows = deliveries.map((delivery) => el("tr", { "data-delivery": delivery.delivery_id, class: delivery.state },
      el("td", {}, statusBadge(delivery.event_status)), el("td", { class: "num" }, `webhook ${delivery.webhook_id}`),
      el("td", {}, deliveryState(delivery))));
    return [el("h3", {}, "notifications"), el("table", { class: "deliveries" },
      el("thead", {}, el("tr", {}, ...["event", "to", "delivery"].map((t) => el("th", {}, t)))),
      el("tbody", {}, ...rows))];
  }

  function renderOverview() {
    const job = S.current;
    const body = $("tab-body");
    if (!body || !job) return;
    const meta = job.metadata || {};
    const model = meta.model && typeof meta.model === "object" ? meta.model : null;
    const fields = [
      ["cluster", job.cluster ?? "—"],
      ["status", statusBadge(job.status)],
      ["stage", job.stage ?? "—"],
      ["message", job.message ?? "—"],
      ["slurm", C.slurmText(job.slurm)],
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
        el("td", {}, event.stage ?? ""), el("td", { class: "message" }, event.message ?? "", ...writer(event)));
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
    body.replaceChildren(list, el("h3", {}, "timeline"), timeline, ...notifications(job.deliveries || []),
      el("h3", {}, "raw"), ...raw);
  }
})((window.C = window.C || {}));
