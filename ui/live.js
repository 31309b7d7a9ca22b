// Live updates: the event stream read with fetch (so the token travels in a header), and
// polling of /api/events with the cursor when streaming fails or is not wanted.
"use strict";

(function (C) {
  const RETRY_STREAM_MS = 30000; // while polling, how often to try the stream again
  const POLL_LIMIT = 500;

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
   * The live connection. ``onEvents(events)`` gets every new event (the stream's carry the
   * job summary as ``job``); ``onState(state, text)`` the connection state for the header.
   */
  C.Live = class {
    constructor(onEvents, onState) {
      this.onEvents = onEvents;
      this.onState = onState;
      this.interval = 5000;
      this.cursor = null;
      this.mode = "off";
      this.abort = null;
      this.timer = null;
      this.generation = 0;
    }

    /** Poll interval in ms (0: paused). Paused closes the stream too. */
    setInterval(ms) {
      this.interval = ms;
      this.start();
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

    stop() {
      this.generation += 1;
      if (this.abort) this.abort.abort();
      this.abort = null;
      clearTimeout(this.timer);
      this.timer = null;
    }

    state(mode, text) {
      this.mode = mode;
      this.onState(mode, text);
    }

    async stream() {
      const generation = this.generation;
      const abort = (this.abort = new AbortController());
      this.state("connecting", "connecting to the event stream…");
      let response;
      try {
        response = await C.fetch("api/events/stream", { after: this.cursor }, {
          headers: C.headers({ Accept: "text/event-stream" }),
          signal: abort.signal,
        });
      } catch (error) {
        if (generation !== this.generation) return;
        this.fallBack(error);
        return;
      }
      C.ok();
      this.state("live", "live: event stream");
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      const parser = new C.SSEParser((event) => {
        if (event.type !== "job-event") return;
        const record = JSON.parse(event.data);
        this.cursor = record.id;
        this.onEvents([record]);
      });
      try {
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          parser.feed(value);
        }
      } catch (error) {
        if (generation !== this.generation) return;
      }
      if (generation !== this.generation) return;
      // The server ended the stream (its lifetime, a restart): resume from the cursor.
      this.timer = setTimeout(() => this.generation === generation && this.stream(), 500);
    }

    async fallBack(error) {
      if (error instanceof C.ApiError && (error.status === 401 || error.status === 403)) {
        C.explain(error);
        this.state("offline", `offline: ${error.status} from the collector`);
        this.timer = setTimeout(() => this.start(), RETRY_STREAM_MS);
        return;
      }
      const why = error instanceof C.ApiError && error.status ? `${error.status} ${error.detail}` : "no connection";
      if (this.cursor === null) this.cursor = await this.edge();
      this.reason = why;
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
})((window.C = window.C || {}));
