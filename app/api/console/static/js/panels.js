// The other views of a conversation: its runs, its versions, and its details (metadata).

import * as api from "./api.js";
import { badge, field, fill, h } from "./dom.js";
import { duration, plural, shortId, timeElement, usage, when } from "./format.js";
import { messageArticle, summaryArticle, systemArticle } from "./render.js";
import { VirtualFeed } from "./virtual.js";

const STATUS_TONE = {
  completed: "good",
  requires_action: "warn",
  running: "info",
  queued: "info",
  failed: "bad",
  cancelled: "bad",
  conflicted: "bad",
  interrupted: "bad",
};

function dl(pairs) {
  return h(
    "dl",
    { class: "facts" },
    pairs.filter(Boolean).map(([term, value]) => h("div", {}, h("dt", {}, term), h("dd", {}, value))),
  );
}

// --- runs -------------------------------------------------------------------------------

export class RunsPanel {
  constructor({ onError, onCancel }) {
    this.onError = onError;
    this.onCancel = onCancel;
    this.id = null;
    this.cursor = null;
    this.stale = true;
    this.list = h("ol", { class: "runs", "aria-label": "Runs" });
    this.more = h("button", { type: "button", class: "quiet", hidden: true, onclick: () => this.load(true) }, "Load more runs");
    this.note = h("p", { class: "muted panel-note" }, "Oldest first.");
    this.element = h("div", { class: "panel-scroll" }, this.note, this.list, this.more);
  }

  open(id) {
    this.id = id;
    this.stale = true;
    this.list.replaceChildren();
  }

  async show() {
    if (this.stale) await this.load(false);
  }

  async load(more) {
    const id = this.id;
    try {
      const url = api.query(api.conversationPath(id, "runs"), { limit: 20, cursor: more ? this.cursor : undefined });
      const { body } = await api.get(url);
      if (id !== this.id) return;
      if (!more) this.list.replaceChildren();
      for (const run of body.items) this.list.append(this.item(run));
      if (!this.list.childElementCount) this.list.append(h("li", { class: "muted" }, "No runs yet."));
      this.cursor = body.next_cursor;
      this.more.hidden = !this.cursor;
      this.stale = false;
    } catch (error) {
      this.onError(error);
    }
  }

  item(run) {
    const error = run.error;
    const action = run.required_action?.tool_calls || [];
    const active = run.status === "running" || run.status === "queued";
    return h(
      "li",
      { class: "run" },
      h(
        "div",
        { class: "run-head" },
        badge(run.status.replace("_", " "), STATUS_TONE[run.status] || ""),
        h("code", { title: run.run_id }, shortId(run.run_id)),
        h("span", { class: "muted" }, run.agent),
        timeElement(run.created_at),
        active ? h("button", { type: "button", class: "danger small", onclick: () => this.onCancel(run.run_id) }, "Cancel run") : null,
      ),
      dl([
        ["Run id", h("code", {}, run.run_id)],
        ["Duration", duration(run.duration_ms)],
        ["Usage", usage(run.usage)],
        ["Stored", run.stored ? "yes" : "no"],
        ["Messages", plural(run.new_messages?.length || 0, "new message")],
        run.compactions?.length ? ["Compactions", String(run.compactions.length)] : null,
        action.length ? ["Waits for", action.map((c) => `${c.name} (${c.kind})`).join(", ")] : null,
        ["Trace id", run.trace_id ? h("code", {}, run.trace_id) : "—"],
        ["Started", when(run.started_at)],
        ["Finished", when(run.finished_at)],
      ]),
      error
        ? h(
            "p",
            { class: "error-note" },
            h("strong", {}, error.title || "Error"),
            error.detail ? `: ${error.detail}` : "",
            error.code ? h("code", { class: "muted" }, ` ${error.code}`) : "",
          )
        : null,
    );
  }
}

// --- versions ---------------------------------------------------------------------------

/**
 * The conversation's stored versions (GET …/versions, newest first), each readable
 * (GET …/context?version=N; 410 once past retention) and forkable (POST …/fork {"version"}).
 * A server without versions answers 404 there: the tab is then hidden (`supported` false).
 */
export class VersionsPanel {
  constructor({ onError, onFork }) {
    this.onError = onError;
    this.onFork = onFork;
    this.id = null;
    this.cursor = null;
    this.stale = true;
    this.list = h("ol", { class: "versions", "aria-label": "Versions" });
    this.more = h("button", { type: "button", class: "quiet", hidden: true, onclick: () => this.load(true) }, "Load older versions");
    this.viewTitle = h("h3", {});
    this.viewNote = h("p", { class: "muted", role: "status" });
    this.feed = new VirtualFeed({
      label: "Context of this version",
      render: (row) => (row.kind === "system" ? systemArticle(row.text) : row.kind === "summary" ? summaryArticle(row.text) : messageArticle(row.message)),
      empty: "This version has no messages.",
    });
    this.viewer = h("section", { class: "version-view", hidden: true, "aria-label": "A stored version" }, this.viewTitle, this.viewNote, this.feed.element);
    this.element = h("div", { class: "versions-panel" }, h("div", { class: "panel-scroll versions-list" }, h("p", { class: "muted panel-note" }, "Newest first."), this.list, this.more), this.viewer);
  }

  /** Whether this server keeps versions: a probe of the first page (404: no such route). */
  static async supported(id) {
    try {
      await api.get(api.query(api.conversationPath(id, "versions"), { limit: 1 }));
      return true;
    } catch (error) {
      if (error.status === 404 || error.status === 405) return false;
      throw error;
    }
  }

  open(id) {
    this.id = id;
    this.stale = true;
    this.list.replaceChildren();
    this.viewer.hidden = true;
  }

  async show() {
    if (this.stale) await this.load(false);
  }

  async load(more) {
    const id = this.id;
    try {
      const url = api.query(api.conversationPath(id, "versions"), { limit: 50, cursor: more ? this.cursor : undefined });
      const { body } = await api.get(url);
      if (id !== this.id) return;
      if (!more) this.list.replaceChildren();
      this.current = body.current_version;
      for (const version of body.items) this.list.append(this.item(version));
      if (!this.list.childElementCount) this.list.append(h("li", { class: "muted" }, "No versions kept."));
      this.cursor = body.next_cursor;
      this.more.hidden = !this.cursor;
      this.stale = false;
    } catch (error) {
      this.onError(error);
    }
  }

  item(version) {
    return h(
      "li",
      { class: "version" },
      h(
        "div",
        { class: "run-head" },
        h("strong", {}, `Version ${version.version}`),
        version.version === this.current ? badge("current", "good") : null,
        version.kind ? badge(version.kind) : null,
        h("span", { class: "muted" }, plural(version.message_count ?? 0, "message")),
        timeElement(version.created_at),
        version.run_id ? h("code", { class: "muted", title: version.run_id }, `run ${shortId(version.run_id)}`) : null,
      ),
      h(
        "div",
        { class: "row" },
        h("button", { type: "button", class: "quiet small", onclick: () => this.view(version.version) }, "View"),
        h("button", { type: "button", class: "quiet small", onclick: () => this.onFork(version.version) }, "Fork this version"),
      ),
    );
  }

  async view(number) {
    const id = this.id;
    this.viewer.hidden = false;
    this.viewTitle.textContent = `Version ${number}`;
    this.viewNote.textContent = "Reading…";
    try {
      const { body } = await api.get(api.query(api.conversationPath(id, "context"), { version: number }));
      if (id !== this.id) return;
      const rows = [];
      if (body.system_prompt) rows.push({ kind: "system", text: body.system_prompt });
      if (body.summary) rows.push({ kind: "summary", text: body.summary });
      for (const message of body.messages) rows.push({ kind: "message", message });
      this.viewNote.textContent = plural(body.messages.length, "message");
      this.feed.setItems(rows);
    } catch (error) {
      this.feed.setItems([]);
      if (error.status === 410) this.viewNote.textContent = `Version ${number} is past retention: its context is no longer kept.`;
      else {
        this.viewNote.textContent = error.message;
        this.onError(error);
      }
    }
  }
}

// --- details ----------------------------------------------------------------------------

export class DetailsPanel {
  constructor({ onError, onChanged }) {
    this.onError = onError;
    this.onChanged = onChanged;
    this.conversation = null;
    this.facts = h("div", {});
    this.metadata = h("tbody", {});
    this.key = h("input", { type: "text", autocomplete: "off", spellcheck: "false", required: true });
    this.value = h("input", { type: "text", autocomplete: "off" });
    const add = h(
      "form",
      { class: "metadata-add", onsubmit: (event) => this.add(event) },
      field("Key", this.key),
      field("Value", this.value),
      h("button", { type: "submit" }, "Set"),
    );
    this.element = h(
      "div",
      { class: "panel-scroll details" },
      this.facts,
      h("h3", {}, "Metadata"),
      h("table", { class: "metadata" }, h("caption", { class: "visually-hidden" }, "Metadata"), h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Key"), h("th", { scope: "col" }, "Value"), h("th", { scope: "col" }, h("span", { class: "visually-hidden" }, "Actions")))), this.metadata),
      add,
    );
  }

  show(conversation) {
    this.conversation = conversation;
    fill(
      this.facts,
      dl([
        ["Id", h("code", {}, conversation.id)],
        ["ETag", h("code", {}, conversation.etag)],
        ["Created", when(conversation.created_at)],
        ["Updated", when(conversation.updated_at)],
        ["Expires", conversation.expires_at ? when(conversation.expires_at) : "never (unless the deployment's retention applies)"],
        ["Messages", `${conversation.message_count}${conversation.has_summary ? " after a summary" : ""}`],
        ["Runs", String(conversation.run_count)],
        ["Transcript entries", String(conversation.transcript_count)],
        ["Active run", conversation.active_run_id ? h("code", {}, conversation.active_run_id) : "none"],
        ["System prompt", conversation.system_prompt ? h("div", { class: "text" }, conversation.system_prompt) : "none"],
      ]),
    );
    const entries = Object.entries(conversation.metadata || {});
    fill(
      this.metadata,
      entries.length
        ? entries.map(([key, value]) =>
            h("tr", {}, h("td", {}, h("code", {}, key)), h("td", {}, value), h("td", {}, h("button", { type: "button", class: "quiet small", "aria-label": `Remove ${key}`, onclick: () => this.patch({ [key]: null }) }, "Remove"))),
          )
        : h("tr", {}, h("td", { colspan: "3", class: "muted" }, "No metadata.")),
    );
  }

  async add(event) {
    event.preventDefault();
    await this.patch({ [this.key.value.trim()]: this.value.value });
    this.key.value = "";
    this.value.value = "";
  }

  async patch(metadata) {
    try {
      const { body } = await api.json("PATCH", api.conversationPath(this.conversation.id), {
        json: { metadata },
        contentType: "application/merge-patch+json",
      });
      this.show(body);
      this.onChanged(body);
    } catch (error) {
      this.onError(error);
    }
  }
}
