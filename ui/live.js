// Live updates: the event and cluster streams read with fetch (so the token travels in a header),
// and polling (/api/events with the cursor, /api/clusters) when streaming fails or is not wanted.
"use strict";

(function (C) {
  const RETRY_STREAM_MS = 30000; // while polling, how often to try the stream again
  const POLL_LIMIT = 500;
  const RESUME_MS = 500; // after a stream the server ended, before reconnecting

  /** Split a text/event-stream body into events; ``feed`` takes decoded text as it arrives. */
  C.SSEParser = class {
    constructor(onEvent) {
      this.onEvent = onEvent;
      this.buffer = "";
      this.reset();
    }

    reset() {
      this.type = "";
      this.data = [];
      this.id = null;
    }

    feed(text) {
      this.buffer += text;
      // A lone \r at the end may be half of \r\n: keep it for the next chunk.
      const lines = this.buffer.split(/\r\n|\r(?!$)|\n/);
      this.buffer = lines.pop();
      for (const line of lines) this.line(line);
    }

    line(line) {
      if (line === "") {
        if (this.data.length) this.onEvent({ type: this.type || "message", data: this.data.join("\n"), id: this.id });
        this.reset();
        return;
      }
      if (line.startsWith(":")) return; // a comment
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? "" : line.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "event") this.type = value;
      else if (field === "data") this.data.push(value);
      else if (field === "id") this.id = value;
    }
  };

  /**
   * Hand each event of ``body`` (a stream of UTF-8 bytes, as fetch gives it) to ``onEvent``;
   * resolves when the body ends or breaks (a broken body ends the stream as a closed one does).
   */
  C.readEvents = async function (body, onEvent) {
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    const parser = new C.SSEParser(onEvent);
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        parser.feed(value);
      }
    } catch (error) {
      // The caller reconnects.
    }
  };

  /** A 401 or 403: polling would be refused too, so only a new token (or a later retry) helps. */
  const refused = (error) => error instanceof C.ApiError && (error.status === 401 || error.status === 403);
  const why = (error) => (error instanceof C.ApiError && error.status ? `${error.status} ${error.detail}` : "no connection");

  /** What the live connections share: a generation per (re)start, so an older one's answers are dropped. */
  class Connection {
    constructor() {
      this.interval = 5000;
      this.abort = null;
      this.timer = null;
      this.generation = 0;
    }

    /** Poll interval in ms (0: paused). Paused closes the stream too. */
    setInterval(ms) {
      this.interval = ms;
      this.start();
    }

    stop() {
      this.generation += 1;
      if (this.abort) this.abort.abort();
      this.abort = null;
      clearTimeout(this.timer);
      this.timer = null;
    }

    /** ``fn`` after ``ms``, unless the connection restarts meanwhile. */
    later(fn, ms) {
      const generation = this.generation;
      this.timer = setTimeout(() => generation === this.generation && fn(), ms);
    }

    /** Open ``path`` as an event stream, read with fetch so the token travels in a header. */
    open(path, params) {
      const abort = (this.abort = new AbortController());
      return C.fetch(path, params, { headers: { Accept: "text/event-stream" }, signal: abort.signal });
    }

    /** Hand each event of ``response`` to ``onEvent`` until the body ends; false if the connection restarted meanwhile. */
    async consume(response, generation, onEvent) {
      await C.readEvents(response.body, onEvent);
      return generation === this.generation;
    }
  }

  /**
   * The live connection. ``onEvents(events)`` gets every new event (the stream's carry the
   * job summary as ``job``); ``onState(state, text)`` the connection state for the header.
   */
  C.Live = class extends Connection {
    constructor(onEvents, onState) {
      super();
      this.onEvents = onEvents;
      this.onState = onState;
      this.cursor = null;
      this.mode = "off";
    }

    /** (Re)connect: the stream first, polling when it fails. */
    start() {
      this.stop();
      if (!this.interval) {
        this.state("paused", "paused: no live updates");
        return;
      }
      this.stream();
    }

    state(mode, text) {
      this.mode = mode;
      this.onState(mode, text);
    }

    async stream() {
      const generation = this.generation;
      this.state("connecting", "connecting to the event stream…");
      let response;
      try {
        response = await this.open("api/events/stream", { after: this.cursor });
      } catch (error) {
        if (generation !== this.generation) return;
        this.fallBack(error);
        return;
      }
      C.ok();
      this.state("live", "live: event stream");
      const current = await this.consume(response, generation, (event) => {
        if (event.type !== "job-event") return;
        const record = JSON.parse(event.data);
        this.cursor = record.id;
        this.onEvents([record]);
      });
      // The server ended the stream (its lifetime, a restart): resume from the cursor.
      if (current) this.later(() => this.stream(), RESUME_MS);
    }

    async fallBack(error) {
      if (refused(error)) {
        C.explain(error);
        this.state("offline", `offline: ${error.status} from the collector`);
        this.timer = setTimeout(() => this.start(), RETRY_STREAM_MS);
        return;
      }
      const reason = why(error);
      if (this.cursor === null) this.cursor = await this.edge();
      this.reason = reason;
      this.poll(this.generation, Date.now() + RETRY_STREAM_MS);
    }

    /**
     * Where polling starts when no stream ever gave a cursor: the newest event of the most
     * recently updated job. Events after it are at worst a few already past, never missed.
     */
    async edge() {
      try {
        const listed = await C.get("api/jobs", { sort: "updated", per_page: 1 });
        const job = listed.jobs[0];
        if (!job) return 0;
        const events = await C.get(`api/jobs/${encodeURIComponent(job.job_id)}/events`,
          { cluster: job.cluster, after: 0, limit: 1000 });
        return events.next_cursor || 0;
      } catch (error) {
        return 0;
      }
    }

    async poll(generation, retryStreamAt) {
      if (generation !== this.generation) return;
      const seconds = this.interval / 1000;
      let full = false;
      try {
        const page = await C.get("api/events", { after: this.cursor || 0, limit: POLL_LIMIT });
        if (generation !== this.generation) return;
        C.ok();
        this.state("polling", `polling every ${seconds} s (stream unavailable: ${this.reason})`);
        if (page.events.length) {
          this.cursor = page.next_cursor;
          this.onEvents(page.events);
        }
        full = page.events.length === POLL_LIMIT;
      } catch (error) {
        if (generation !== this.generation) return;
        C.explain(error);
        this.state("offline", `offline: retrying every ${seconds} s`);
      }
      if (Date.now() >= retryStreamAt) {
        this.stream();
        return;
      }
      // A full page means more are waiting: read on at once instead of after the interval.
      this.timer = setTimeout(() => this.poll(generation, retryStreamAt), full ? 0 : this.interval);
    }
  };

  /**
   * The clusters' health, live: /api/clusters/stream sends a cluster-status event per cluster
   * at once and one per change after. It has no ids, so a reconnect simply starts afresh.
   * When it fails, GET /api/clusters on the poll interval, trying the stream again now and then.
   * ``onClusters(entries, whole)``: ``whole`` when ``entries`` is every cluster (a GET), else
   * one changed cluster; ``onState(state, text)`` as for C.Live.
   */
  C.ClusterLive = class extends Connection {
    constructor(onClusters, onState) {
      super();
      this.onClusters = onClusters;
      this.onState = onState;
    }

    start() {
      this.stop();
      if (!this.interval) {
        this.onState("paused", "paused: no live cluster health");
        this.read(); // paused still shows the clusters as they are now
        return;
      }
      this.stream();
    }

    async stream() {
      const generation = this.generation;
      let response;
      try {
        response = await this.open("api/clusters/stream");
      } catch (error) {
        if (generation === this.generation) this.fallBack(error);
        return;
      }
      this.onState("live", "live: cluster stream");
      const current = await this.consume(response, generation, (event) => {
        if (event.type === "cluster-status") this.onClusters([JSON.parse(event.data)], false);
      });
      if (current) this.later(() => this.stream(), RESUME_MS);
    }

    fallBack(error) {
      // The job list explains a refused token on the hint line; saying it twice helps nobody.
      if (refused(error)) {
        this.onState("offline", `offline: ${error.status} from the collector`);
        this.later(() => this.start(), RETRY_STREAM_MS);
        return;
      }
      this.reason = why(error);
      this.poll(Date.now() + RETRY_STREAM_MS);
    }

    async poll(retryStreamAt) {
      const generation = this.generation;
      const read = await this.read();
      if (generation !== this.generation) return;
      const seconds = this.interval / 1000;
      if (read) this.onState("polling", `polling every ${seconds} s (stream unavailable: ${this.reason})`);
      else this.onState("offline", `offline: retrying every ${seconds} s`);
      if (Date.now() >= retryStreamAt) this.stream();
      else this.later(() => this.poll(retryStreamAt), this.interval);
    }

    /** One GET of every cluster; false when it failed. */
    async read() {
      const generation = this.generation;
      try {
        const listed = await C.get("api/clusters");
        if (generation === this.generation) this.onClusters(listed.clusters, true);
        return true;
      } catch (error) {
        return false;
      }
    }
  };
})((window.C = window.C || {}));
