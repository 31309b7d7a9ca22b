// The API client: where the collector is, the read token, requests, downloads and the hint line.
// Classic scripts sharing one namespace (not ES modules), so the page also works opened from a file.
"use strict";

(function (C) {
  const TOKEN_KEY = "collector.token";
  const API_KEY = "collector.api";

  /** Take #token= and #api= from the fragment into localStorage and strip them from the address; say if any was there. */
  C.consumeFragment = function () {
    const fragment = new URLSearchParams(location.hash.replace(/^#/, ""));
    let changed = false;
    if (fragment.has("token")) {
      store(TOKEN_KEY, fragment.get("token").trim());
      fragment.delete("token");
      changed = true;
    }
    if (fragment.has("api")) {
      store(API_KEY, fragment.get("api").trim());
      fragment.delete("api");
      changed = true;
    }
    if (changed) {
      const rest = fragment.toString();
      // replaceState: the token never lands in the history, and nothing reloads.
      history.replaceState(history.state, "", location.pathname + location.search + (rest ? "#" + rest : ""));
    }
    return changed;
  };

  function store(key, value) {
    try {
      if (value) localStorage.setItem(key, value);
      else localStorage.removeItem(key);
    } catch (e) {
      // Storage can be off (private mode, file:// policies): the value lives for this page only.
      memory[key] = value;
    }
  }
  const memory = {};

  function load(key) {
    try {
      return localStorage.getItem(key) || memory[key] || "";
    } catch (e) {
      return memory[key] || "";
    }
  }

  C.token = () => load(TOKEN_KEY);
  C.setToken = (value) => store(TOKEN_KEY, value.trim());
  C.apiBase = () => load(API_KEY);
  C.setApiBase = (value) => store(API_KEY, value.trim());

  /** The absolute URL of an API path ("api/jobs"): under the stored base, else beside the page. */
  C.url = function (path, params) {
    const base = C.apiBase();
    // Relative to the page when no base is stored: /api/... at /, /status/api/... under /status/.
    const root = base ? base.replace(/\/+$/, "") + "/" : new URL(".", location.href).href;
    const url = new URL(path, root);
    for (const [key, value] of Object.entries(params || {})) {
      if (value !== undefined && value !== null && value !== "") url.searchParams.set(key, value);
    }
    return url;
  };

  /** Request headers: the bearer token when one is stored. */
  C.headers = function (extra) {
    const headers = Object.assign({}, extra || {});
    const token = C.token();
    if (token) headers.Authorization = "Bearer " + token;
    return headers;
  };

  /** An error from the collector (status set) or from the way to it (status 0). */
  class ApiError extends Error {
    constructor(message, status, url, detail) {
      super(message);
      this.status = status;
      this.url = url;
      this.detail = detail;
    }
  }
  C.ApiError = ApiError;

  /** fetch, with network failures and non-2xx answers turned into ApiError. */
  C.fetch = async function (path, params, options) {
    const url = C.url(path, params);
    let response;
    try {
      response = await fetch(url, Object.assign({ headers: C.headers(), cache: "no-store" }, options || {}));
    } catch (e) {
      if (e.name === "AbortError") throw e;
      throw new ApiError(String(e.message || e), 0, url);
    }
    if (!response.ok) {
      let detail = response.statusText;
      try {
        detail = (await response.json()).detail || detail;
      } catch (e) {
        // Not our envelope (a proxy's page): keep the status text.
      }
      throw new ApiError(detail, response.status, url, detail);
    }
    return response;
  };

  /** GET a JSON document. */
  C.get = async function (path, params, options) {
    return (await C.fetch(path, params, options)).json();
  };

  /** Save ``blob`` under ``name`` through a temporary link (the token rides in the fetch, not the URL). */
  C.save = function (blob, name) {
    const link = document.createElement("a");
    link.href = URL.createObjectURL(blob);
    link.download = name;
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(link.href), 60000);
  };

  // ------------------------------------------------------------------ the hint line

  let hinted = null;

  /** Explain a failed call on the hint line, in terms of what the viewer can do about it. */
  C.explain = async function (error) {
    if (!(error instanceof ApiError)) {
      C.hint(String(error), "error");
      return;
    }
    const where = error.url ? error.url.origin : "the collector";
    if (error.status === 401) {
      C.hint(C.token()
        ? `The collector at ${where} refused the read token (401: ${error.detail}). Paste a valid read token in the token field.`
        : `The collector at ${where} needs a read token (401). Paste it in the token field, or open the page with #token=<read token>.`,
      "auth");
    } else if (error.status === 403) {
      C.hint(`The collector at ${where} refused this token for that request (403: ${error.detail}).`, "auth");
    } else if (error.status === 0) {
      C.hint(await networkProblem(error.url), "network");
    } else {
      C.hint(`The collector answered ${error.status}: ${error.detail}`, "error");
    }
  };

  async function networkProblem(url) {
    if (location.protocol === "file:" && !C.apiBase()) {
      return "This page was opened from a file: set the collector's address in the API field (or open it with #api=https://collector.example).";
    }
    const crossOrigin = url.origin !== location.origin;
    if (crossOrigin) {
      // An opaque no-cors request succeeds whenever the server answers at all, so success
      // here means the collector is up and only its CORS permission is missing.
      try {
        await fetch(new URL("api/health", url.origin + "/"), { mode: "no-cors", cache: "no-store" });
        const origin = location.origin === "null" ? "'*'" : location.origin;
        return `The collector at ${url.origin} answered but does not allow this page's origin: start it with --cors-origin ${origin} (or set COLLECTOR_CORS_ORIGINS).`;
      } catch (e) {
        // Unreachable: fall through.
      }
    }
    return `Cannot reach the collector at ${url.origin} (network error). Is it running, and is the API field right?`;
  }

  /** Show ``text`` on the hint line (empty clears it); ``kind`` styles it. */
  C.hint = function (text, kind) {
    const line = document.getElementById("hint");
    if (!line) return;
    line.textContent = text || "";
    line.dataset.kind = text ? kind || "info" : "";
    line.hidden = !text;
    hinted = text || null;
  };

  /** Clear the hint line after a call succeeded, if it was explaining a failure. */
  C.ok = function () {
    if (hinted) C.hint("");
  };
})((window.C = window.C || {}));
