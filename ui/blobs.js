// The detail pane's logs and tachometer tabs: streamed log files tailed as text, and
// capture segments listed and downloaded as they are (nothing is decoded here).
"use strict";

(function (C) {
  const TAIL_BYTES = 256 * 1024;
  const MAX_LINES = 20000;
  // CSI sequences (colours, cursor moves), OSC sequences (titles, links), and other two-byte escapes.
  const ANSI = /\x1b\[[0-?]*[ -\/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]/g;

  /** ``text`` without ANSI escape sequences. */
  C.stripAnsi = (text) => text.replace(ANSI, "");

  C.formatBytes = function (n) {
    if (n < 1024) return `${n} B`;
    const units = ["KiB", "MiB", "GiB", "TiB"];
    let value = n / 1024;
    let unit = 0;
    while (value >= 1024 && unit < units.length - 1) {
      value /= 1024;
      unit += 1;
    }
    return `${value.toFixed(value < 10 ? 1 : 0)} ${units[unit]}`;
  };

  const basename = (name) => name.split("/").pop();

  function jobPath(job, what) {
    return `api/jobs/${encodeURIComponent(job.job_id)}/${what}`;
  }

  function jobParams(job, extra) {
    return Object.assign({ cluster: job.cluster || undefined }, extra || {});
  }

  /** The logs tab of one job: a file list, and one file tailed into a text view. */
  C.LogsTab = class {
    constructor(root, job, options) {
      this.root = root;
      this.job = job;
      this.options = options; // {file, onFile(name)}
      this.file = null;
      this.lines = [];
      this.partial = "";
      this.offset = 0;
      this.busy = 0;
      this.render();
      this.refresh().then(() => {
        if (options.file) this.open(options.file, false);
      });
    }

    render() {
      const { el } = C;
      this.list = el("ul", { class: "files", "aria-label": "log files" });
      this.filter = el("input", { type: "search", placeholder: "filter lines", "aria-label": "filter lines" });
      this.filter.addEventListener("input", () => this.show());
      this.follow = el("input", { type: "checkbox", checked: "" });
      this.fromStart = el("button", { type: "button", class: "from-start" }, "from start");
      this.fromStart.addEventListener("click", () => this.file && this.open(this.file, true));
      this.download = el("button", { type: "button", class: "download" }, "download");
      this.download.addEventListener("click", () => this.file && this.saveWhole());
      this.status = el("span", { class: "log-status" });
      this.text = el("pre", { class: "log", tabindex: "0", "aria-label": "log text" });
      this.bar = el("div", { class: "log-bar", hidden: "" }, this.filter,
        el("label", {}, this.follow, " follow"), this.fromStart, this.download, this.status);
      this.root.replaceChildren(this.list, this.bar, this.text);
    }

    async refresh() {
      let listed;
      try {
        listed = await C.get(jobPath(this.job, "logs"), jobParams(this.job));
      } catch (error) {
        C.explain(error);
        return;
      }
      C.ok();
      this.files = listed.files;
      const items = listed.files.map((f) => {
        const button = C.el("button", { type: "button", class: "file", "data-file": f.file },
          f.file, C.el("span", { class: "size" }, ` ${C.formatBytes(f.size)}${f.final ? " · final" : ""}`));
        if (f.file === this.file) button.setAttribute("aria-current", "true");
        button.addEventListener("click", () => this.open(f.file, false));
        return C.el("li", {}, button);
      });
      this.list.replaceChildren(...(items.length ? items : [C.el("li", { class: "empty" }, "no streamed log files")]));
    }

    /** Open ``name`` at its last 256 KiB, or from its first byte. */
    async open(name, fromStart) {
      this.file = name;
      this.options.onFile(name);
      for (const button of this.list.querySelectorAll("button.file")) {
        button.toggleAttribute("aria-current", button.dataset.file === name);
      }
      const known = (this.files || []).find((f) => f.file === name);
      const size = known ? known.size : 0;
      this.offset = fromStart ? 0 : Math.max(0, size - TAIL_BYTES);
      this.skipFirstLine = this.offset > 0; // it starts mid-line (perhaps mid-character)
      this.lines = [];
      this.partial = "";
      this.startedAt = this.offset;
      this.capped = false;
      this.bar.hidden = false;
      this.generation = (this.generation || 0) + 1;
      await this.read(this.generation);
    }

    /** Read from the offset to the end of what is stored (1 MiB per request). */
    async read(generation) {
      // One read loop per opened file; a newer open() starts its own (the old one stops).
      if (this.busy === generation) return;
      this.busy = generation;
      try {
        for (;;) {
          const chunk = await C.get(jobPath(this.job, "logs"), jobParams(this.job, { file: this.file, offset: this.offset }));
          if (generation !== this.generation) return;
          C.ok();
          this.size = chunk.size;
          this.final = chunk.final;
          const moved = chunk.next_offset > this.offset;
          this.offset = chunk.next_offset;
          if (chunk.data) this.append(chunk.data);
          if (!moved || this.offset >= chunk.size) break;
        }
        this.show();
      } catch (error) {
        C.explain(error);
      } finally {
        if (this.busy === generation) this.busy = 0;
      }
    }

    append(data) {
      let text = this.partial + C.stripAnsi(data);
      if (this.skipFirstLine) {
        const newline = text.indexOf("\n");
        if (newline < 0) {
          this.partial = text;
          return;
        }
        text = text.slice(newline + 1);
        this.skipFirstLine = false;
      }
      const lines = text.split(/\r?\n/);
      this.partial = lines.pop();
      // A carriage return redraws a line in a terminal (progress bars): keep what it ends as.
      for (const line of lines) this.lines.push(line.includes("\r") ? line.slice(line.lastIndexOf("\r") + 1) : line);
      if (this.lines.length > MAX_LINES) {
        this.lines.splice(0, this.lines.length - MAX_LINES);
        this.capped = true;
      }
    }

    show() {
      const needle = this.filter.value.toLowerCase();
      let lines = this.partial ? this.lines.concat([this.partial]) : this.lines;
      if (needle) lines = lines.filter((line) => line.toLowerCase().includes(needle));
      const stick = this.text.scrollTop + this.text.clientHeight >= this.text.scrollHeight - 4;
      this.text.textContent = lines.join("\n");
      const shown = needle ? `${lines.length} matching lines` : `${this.lines.length} lines`;
      let cut = "";
      if (this.capped) cut = ` · only the newest ${MAX_LINES.toLocaleString()} lines are kept`;
      else if (this.startedAt > 0) cut = ` · from byte ${this.startedAt.toLocaleString()} (the last 256 KiB; "from start" reads it all)`;
      this.status.textContent = `${shown} · ${C.formatBytes(this.offset)} of ${C.formatBytes(this.size || 0)}${this.final ? " · final" : ""}${cut}`;
      if (this.follow.checked && (stick || !this.shownOnce)) this.text.scrollTop = this.text.scrollHeight;
      this.shownOnce = true;
    }

    /** Called on the poll interval: new files and new bytes of the open file. */
    tick() {
      if (this.file && this.follow.checked) this.read(this.generation);
      this.refresh();
    }

    /** Download the whole file as text, a read at a time. */
    async saveWhole() {
      const parts = [];
      let offset = 0;
      this.download.disabled = true;
      try {
        for (;;) {
          const chunk = await C.get(jobPath(this.job, "logs"), jobParams(this.job, { file: this.file, offset }));
          parts.push(chunk.data);
          if (chunk.next_offset <= offset || chunk.next_offset >= chunk.size) break;
          offset = chunk.next_offset;
        }
        C.save(new Blob(parts, { type: "text/plain;charset=utf-8" }), basename(this.file));
      } catch (error) {
        C.explain(error);
      } finally {
        this.download.disabled = false;
      }
    }
  };

  /** The tachometer tab: capture segments with size and state; complete ones download. */
  C.CapturesTab = class {
    constructor(root, job) {
      this.root = root;
      this.job = job;
      this.list = C.el("table", { class: "captures" });
      this.root.replaceChildren(this.list);
      this.refresh();
    }

    async refresh() {
      let listed;
      try {
        listed = await C.get(jobPath(this.job, "captures"), jobParams(this.job));
      } catch (error) {
        C.explain(error);
        return;
      }
      C.ok();
      const { el } = C;
      const rows = listed.files.map((f) => {
        const action = f.complete
          ? el("button", { type: "button", class: "download", "data-file": f.file }, "download")
          : el("span", { class: "uploading" }, "uploading…");
        if (f.complete) action.addEventListener("click", () => this.save(f.file, action));
        return el("tr", {}, el("td", {}, f.file), el("td", { class: "num" }, C.formatBytes(f.size)),
          el("td", {}, f.complete ? "✓ complete" : "… partial"), el("td", {}, action));
      });
      const head = el("tr", {}, ...["segment", "size", "upload", ""].map((t) => el("th", {}, t)));
      this.list.replaceChildren(el("thead", {}, head), el("tbody", {}, ...(rows.length ? rows
        : [el("tr", {}, el("td", { colspan: "4", class: "empty" }, "no streamed capture segments"))])));
    }

    async save(name, button) {
      button.disabled = true;
      try {
        const response = await C.fetch(jobPath(this.job, "captures"), jobParams(this.job, { file: name }));
        C.save(await response.blob(), basename(name));
      } catch (error) {
        C.explain(error);
      } finally {
        button.disabled = false;
      }
    }

    tick() {
      this.refresh();
    }
  };
})((window.C = window.C || {}));
