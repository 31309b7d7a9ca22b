// The API client: where the collector is, the read tokens, requests, downloads and the hint line.
// Classic scripts sharing one namespace (not ES modules), so the page also works opened from a file.
"use strict";

(function (C) {
  const API_KEY = "collector.api";
  // A token belongs to the API origin it was entered for: "collector.token:http://host:8080".
  // It is only ever sent to that origin, so pointing the page elsewhere (a link with #api=,
  // a typo in the API field) cannot carry a token to a server it was not meant for.
  const TOKEN_PREFIX = "collector.token:";
  // Before tokens were kept per origin: one token, sent wherever the API base pointed.
  const LEGACY_TOKEN_KEY = "collector.token";

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

  /** The normalised origin ("http://127.0.0.1:8080") of an API base; the page's own for none; null if not an http(s) URL. */
  C.originOf = function (base) {
    if (!base) return location.origin; // "null" for a page opened from a file
    try {
      const url = new URL(base);
      return url.protocol === "http:" || url.protocol === "https:" ? url.origin : null;
    } catch (e) {
      return null;
    }
  };

  C.apiBase = () => load(API_KEY);
  C.setApiBase = (value) => store(API_KEY, value.trim());
  /** The origin the page talks to now (null: the API field holds no usable address). */
  C.apiOrigin = () => C.originOf(C.apiBase());
  /** The token stored for ``origin`` ("" for none, and for no origin). */
  C.tokenFor = (origin) => (origin ? load(TOKEN_PREFIX + origin) : "");
  /** The token for the collector the page talks to now. */
  C.token = () => C.tokenFor(C.apiOrigin());
  /** Keep ``value`` as the token of the current API origin (empty: forget it). */
  C.setToken = function (value) {
    const origin = C.apiOrigin();
    if (origin) store(TOKEN_PREFIX + origin, value.trim());
  };

  /**
   * Move a token kept under the old single key to the page's own origin: the origin it was
   * almost surely entered for, and the one that serves the page's scripts (which can read
   * this storage anyway), so no other server learns it. A token already kept there wins.
   */
  C.migrateToken = function () {
    const legacy = load(LEGACY_TOKEN_KEY);
    if (!legacy) return;
    const own = C.originOf("");
    if (!C.tokenFor(own)) store(TOKEN_PREFIX + own, legacy);
    store(LEGACY_TOKEN_KEY, "");
  };

  // ------------------------------------------------------------------ links: #token= and #api=

  /**
   * Take #token= and #api= from the fragment and strip them from the address. #token= alone
   * is the current collector's token. #api= naming the current origin switches at once (with
   * its #token=); naming another origin asks first (C.askSwitch), and its #token= is kept only
   * if the viewer switches. Returns true if anything changed now; a switch accepted later
   * calls ``onSwitch`` instead.
   */
  C.consumeFragment = function (onSwitch) {
    const fragment = new URLSearchParams(location.hash.replace(/^#/, ""));
    if (!fragment.has("token") && !fragment.has("api")) return false;
    const token = fragment.has("token") ? fragment.get("token").trim() : null;
    const api = fragment.has("api") ? fragment.get("api").trim() : null;
    fragment.delete("token");
    fragment.delete("api");
    const rest = fragment.toString();
    // replaceState: the token never lands in the history, and nothing reloads.
    history.replaceState(history.state, "", location.pathname + location.search + (rest ? "#" + rest : ""));
    if (api === null) {
      C.setToken(token);
      return true;
    }
    // A newer link replaces a question still open (and drops its token).
    C.dismissSwitch();
    const origin = C.originOf(api);
    if (!origin) {
      C.hint(`Ignored #api=${api}: not an http:// or https:// address.`, "error");
      return false;
    }
    if (origin === C.apiOrigin()) {
      C.setApiBase(api);
      if (token !== null) C.setToken(token);
      return true;
    }
    C.askSwitch(api, origin, token, onSwitch);
    return false;
  };

  /**
   * The question a link to another collector raises, in the #switch banner (index.html):
   * #switch-accept switches to that origin, #switch-stay keeps the current one. Until the
   * viewer answers, the page goes on reading the current collector with its token.
   */
  C.askSwitch = function (api, origin, token, onSwitch) {
    const banner = document.getElementById("switch");
    const current = C.apiOrigin() || C.apiBase();
    const here = current === "null" ? "this page opened from a file" : current;
    document.getElementById("switch-text").textContent =
      `A link asks this page to read the collector at ${origin} instead of ${here}. Switch only if you trust it: ` +
      `that collector decides what the page shows. Tokens stay with the collector they were entered for` +
      (token ? `; the link's token is kept for ${origin} only if you switch.` : ".");
    const accept = document.getElementById("switch-accept");
    const stay = document.getElementById("switch-stay");
    accept.textContent = `Switch to ${origin}`;
    stay.textContent = `Stay on ${here}`;
    accept.onclick = () => {
      C.dismissSwitch();
      C.setApiBase(api);
      if (token !== null) C.setToken(token);
      onSwitch();
    };
    stay.onclick = () => C.dismissSwitch();
    banner.hidden = false;
    stay.focus();
  };

  /** Close the question, if one is open, as if the viewer stayed (the link's token is dropped with it). */
  C.dismissSwitch = function () {
    const banner = document.getElementById("switch");
    if (!banner) return;
    banner.hidden = true;
    document.getElementById("switch-accept").onclick = null;
    document.getElementById("switch-stay").onclick = null;
  };

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

  /**
   * Request headers for ``url``: ``extra``, and the bearer token stored for the URL's own
   * origin, whatever the API field says by now (it may change while a request is built).
   */
  C.headers = function (url, extra) {
    const headers = {};
    for (const [name, value] of Object.entries(extra || {})) {
      if (name.toLowerCase() !== "authorization") headers[name] = value;
    }
    const token = C.tokenFor(new URL(url).origin);
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
      const init = Object.assign({ cache: "no-store" }, options || {});
      init.headers = C.headers(url, init.headers); // the caller's headers never carry a token
      response = await fetch(url, init);
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
      C.hint(error.url && C.tokenFor(error.url.origin)
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
