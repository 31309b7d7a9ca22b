// Shared helpers, loaded before every other script: building elements, job keys, times and
// durations, rate limits, and the status words and marks every part of the page shows.
// Classic scripts sharing one namespace, C (not ES modules), so the page also works opened from a file.
"use strict";

(function (C) {
  C.STATUSES = ["submitted", "starting", "workers", "frontend", "benchmark", "completed", "failed", "timeout"];
  C.FINISHED = new Set(["completed", "failed", "timeout"]);
  // A mark per status, so the state reads without colour.
  C.MARKS = {
    submitted: "○", starting: "◔", workers: "◑", frontend: "◕", benchmark: "●",
    completed: "✓", failed: "✗", timeout: "⌛",
  };

  /** An element with attributes and children; strings become text nodes (never HTML). */
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

  C.$ = (id) => document.getElementById(id);

  /** A job's identity across clusters: the same job id may run on two. */
  C.keyOf = (job) => `${job.cluster ?? ""}\u0000${job.job_id}`;
  C.parseTime = (text) => (text ? Date.parse(text) : NaN);

  const pad = (n) => String(n).padStart(2, "0");

  C.duration = function (ms) {
    if (!Number.isFinite(ms) || ms < 0) return "";
    let s = Math.floor(ms / 1000);
    const d = Math.floor(s / 86400);
    s -= d * 86400;
    const h = Math.floor(s / 3600);
    s -= h * 3600;
    const m = Math.floor(s / 60);
    s -= m * 60;
    if (d) return `${d}d ${pad(h)}h ${pad(m)}m`;
    if (h) return `${h}h ${pad(m)}m ${pad(s)}s`;
    if (m) return `${m}m ${pad(s)}s`;
    return `${s}s`;
  };

  C.localTime = function (text) {
    const t = C.parseTime(text);
    if (!Number.isFinite(t)) return "";
    const d = new Date(t);
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  };

  C.ago = function (text) {
    const t = C.parseTime(text);
    if (!Number.isFinite(t)) return "";
    const ms = Date.now() - t;
    return ms < 0 ? "just now" : `${C.duration(ms)} ago`;
  };

  /** Elapsed time: ticking for an active job, fixed once it finished. */
  C.elapsed = function (job) {
    const start = C.parseTime(job.started_at || job.submitted_at);
    const end = C.FINISHED.has(job.status) ? C.parseTime(job.completed_at || job.updated_at) : Date.now();
    return C.duration(end - start);
  };

  C.statusBadge = function (status) {
    return C.el("span", { class: `status s-${C.STATUSES.includes(status) ? status : "other"}` },
      C.el("span", { class: "mark", "aria-hidden": "true" }, C.MARKS[status] || "?"), ` ${status}`);
  };

  C.debounce = function (fn, ms) {
    let timer = null;
    return (...args) => {
      clearTimeout(timer);
      timer = setTimeout(() => fn(...args), ms);
    };
  };

  /** ``fn`` at most once per ``ms``, the last call never lost. */
  C.throttle = function (fn, ms) {
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
  };
})((window.C = window.C || {}));
