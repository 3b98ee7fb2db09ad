// The two views of a conversation's messages, each a windowed feed:
// - ContextTimeline: the stored Context (system prompt, the summary, the messages the model
//   sees next), with the run in progress drawn after it as it streams;
// - TranscriptTimeline: the append-only transcript, read page by page as it is scrolled.

import * as api from "./api.js";
import { h } from "./dom.js";
import {
  compactionArticle,
  failedAttempt,
  messageArticle,
  summaryArticle,
  systemArticle,
  transcriptArticle,
} from "./render.js";
import { VirtualFeed } from "./virtual.js";

/** A run as it arrives: the messages completed so far and the one being written. */
export class LiveRun {
  constructor() {
    this.runId = null;
    this.messages = [];
    this.partial = null; // {index → block} of the assistant message being streamed
    this.running = new Set(); // tool calls started, not finished
    this.record = null; // the run record, once run.finished came
    this.problem = null; // an `error` event's problem
  }

  /** One server-sent event of the run (docs/runs.md); whether what is drawn changed. */
  take(event) {
    const data = event.data;
    switch (event.event) {
      case "run.started":
        this.runId = data.run_id;
        return false;
      case "delta":
        this.delta(data);
        return true;
      case "message":
        this.partial = null;
        this.messages.push({ kind: "message", message: data });
        return true;
      case "tool.started":
        this.running.add(data.id);
        return true;
      case "tool.finished":
        this.running.delete(data.tool_call_id);
        return true;
      case "compaction":
        this.messages.push({ kind: "compaction", record: data });
        return true;
      case "run.finished":
        this.record = data;
        return false;
      case "error":
        this.problem = data;
        return false;
      default:
        return false;
    }
  }

  delta(data) {
    const blocks = (this.partial ??= new Map());
    const block = blocks.get(data.index);
    if (data.kind === "text" || data.kind === "thinking") {
      if (block) block[data.kind === "text" ? "text" : "thinking"] += data.text;
      else blocks.set(data.index, data.kind === "text" ? { type: "text", text: data.text } : { type: "thinking", thinking: data.text, signature: "" });
    } else if (data.kind === "tool_call") {
      blocks.set(data.index, { type: "tool_call", id: data.id, name: data.name, arguments: "" });
    } else if (data.kind === "tool_call_arguments" && block) {
      block.arguments += data.text;
    }
  }

  /** The rows to draw after the stored context. */
  rows() {
    const runningKey = [...this.running].join(",");
    const rows = this.messages.map((row) => ({ ...row, live: true, running: this.running, runningKey }));
    if (this.partial?.size) {
      const content = [...this.partial.entries()].sort((a, b) => a[0] - b[0]).map(([, block]) => ({ ...block }));
      rows.push({ kind: "message", live: true, streaming: true, runningKey, message: { type: "assistant", content } });
    }
    return rows;
  }
}

export class ContextTimeline {
  /** forkAt(n): fork keeping the first n messages. */
  constructor({ forkAt }) {
    this.forkAt = forkAt;
    this.id = null;
    this.etag = null;
    this.context = null;
    this.base = 0; // rows of the stored context; live rows come after
    this.liveRows = [];
    this.feed = new VirtualFeed({
      label: "Context",
      render: (row) => this.renderRow(row),
      empty: "No messages yet. Write one below.",
    });
    this.element = this.feed.element;
  }

  renderRow(row) {
    switch (row.kind) {
      case "system":
        return systemArticle(row.text);
      case "summary":
        return summaryArticle(row.text);
      case "compaction":
        return compactionArticle(row.record);
      default: {
        const opts = { live: row.streaming, running: row.running };
        if (row.pending) opts.pending = row.pending;
        if (row.forkable) {
          opts.actions = [
            h("button", { type: "button", class: "quiet small", onclick: () => this.forkAt(row.index + 1), "aria-describedby": null }, "Fork here"),
          ];
        }
        return messageArticle(row.message, opts);
      }
    }
  }

  rowsOf(context, pending) {
    const rows = [];
    if (context.system_prompt) rows.push({ kind: "system", text: context.system_prompt });
    if (context.summary) rows.push({ kind: "summary", text: context.summary });
    const messages = context.messages;
    for (let i = 0; i < messages.length; i += 1) rows.push(this.messageRow(messages, i, pending));
    return rows;
  }

  messageRow(messages, i, pending) {
    // a fork may keep messages 0..i only where message i+1 is not a tool result (a safe cut)
    const next = messages[i + 1];
    return { kind: "message", message: messages[i], index: i, forkable: !next || next.type !== "tool_result", pending };
  }

  /** Read the stored context (again): GET …/context, 304 when it did not change. */
  async load(id, pendingCalls = []) {
    const fresh = id !== this.id;
    if (fresh) {
      this.id = id;
      this.etag = null;
      this.context = null;
    }
    this.feed.busy(true);
    try {
      const headers = this.etag ? { "If-None-Match": this.etag } : {};
      const { body, response } = await api.get(api.conversationPath(id, "context"), { headers });
      if (id !== this.id) return; // another conversation was opened meanwhile
      if (response.status === 304 && this.context) {
        this.setPending(pendingCalls);
        return;
      }
      this.context = body;
      this.etag = response.headers.get("ETag");
      this.pendingIds = new Set(pendingCalls.map((c) => c.id));
      const rows = this.rowsOf(body, this.pendingIds);
      this.base = rows.length;
      this.liveRows = [];
      const follow = fresh || this.feed.atEnd();
      this.feed.setItems(rows, { toEnd: follow, keepScroll: !follow });
    } finally {
      this.feed.busy(false);
    }
  }

  /** Mark the pending calls (they are in the last assistant messages): redraw the messages
   * whose calls were or are pending. */
  setPending(pendingCalls) {
    const ids = new Set(pendingCalls.map((c) => c.id));
    const before = this.pendingIds || new Set();
    this.pendingIds = ids;
    const messages = this.context?.messages || [];
    const offset = this.base - messages.length;
    for (let i = messages.length - 1; i >= Math.max(0, messages.length - 64); i -= 1) {
      const calls = (messages[i].content || []).filter((b) => b.type === "tool_call");
      if (calls.some((b) => ids.has(b.id) || before.has(b.id))) {
        this.feed.replace(offset + i, this.messageRow(messages, i, ids));
      }
    }
  }

  /**
   * After a run: append what it stored without reading the context again, when that is
   * exactly what happened (it started from the state shown, stored, folded nothing, and the
   * conversation now is its result). Otherwise false: the caller reads the context again.
   */
  applyRun(record, conversation) {
    if (!this.context || !record || !record.stored || record.compactions?.length) return false;
    if (record.base_etag !== this.etag || record.etag !== conversation.etag) return false;
    const added = (record.new_messages || []).filter((m) => !failedAttempt(m));
    const messages = this.context.messages;
    if (messages.length + added.length !== conversation.message_count) return false;
    if (Boolean(this.context.summary) !== Boolean(conversation.has_summary)) return false;
    this.clearLive();
    const pending = new Set((conversation.pending_tool_calls || []).map((c) => c.id));
    const before = messages.length;
    messages.push(...added);
    this.etag = record.etag;
    // the message before the new ones may become forkable (or not)
    if (before > 0) this.feed.replace(this.base - 1, this.messageRow(messages, before - 1, pending));
    const rows = [];
    for (let i = before; i < messages.length; i += 1) rows.push(this.messageRow(messages, i, pending));
    this.feed.append(rows);
    this.base += rows.length;
    return true;
  }

  /** Draw a run in progress after the stored messages. */
  showLive(live) {
    const rows = live.rows();
    for (let j = 0; j < rows.length; j += 1) {
      const index = this.base + j;
      if (j < this.liveRows.length) {
        const before = this.liveRows[j];
        if (rows[j].streaming || rows[j].kind !== before.kind || rows[j].message !== before.message || rows[j].runningKey !== before.runningKey) {
          this.feed.replace(index, rows[j]);
        }
      } else {
        this.feed.append([rows[j]]);
      }
    }
    this.feed.truncate(this.base + rows.length);
    this.liveRows = rows;
  }

  clearLive() {
    this.feed.truncate(this.base);
    this.liveRows = [];
  }
}

const TRANSCRIPT_PAGE = 200;

export class TranscriptTimeline {
  constructor({ openConversation }) {
    this.openConversation = openConversation;
    this.id = null;
    this.cursor = null;
    this.lastSeq = 0;
    this.done = false;
    this.loading = null;
    this.feed = new VirtualFeed({
      label: "Transcript",
      render: (entry) => transcriptArticle(entry, { openConversation: this.openConversation }),
      onNearEnd: () => this.more(),
      empty: "The transcript is empty: nothing was admitted yet.",
    });
    this.element = this.feed.element;
  }

  /** Start reading a conversation's transcript from its first entry. */
  async open(id, total) {
    this.id = id;
    this.cursor = null;
    this.lastSeq = 0;
    this.done = false;
    this.feed.setTotal(total);
    this.feed.setItems([]);
    await this.more();
  }

  /** The next page, when the reader nears the end of what is loaded. */
  more() {
    if (this.loading || this.done || !this.id) return this.loading;
    this.loading = this.page().finally(() => {
      this.loading = null;
    });
    return this.loading;
  }

  async page() {
    const id = this.id;
    this.feed.busy(true);
    try {
      const url = api.query(api.conversationPath(id, "transcript"), { limit: TRANSCRIPT_PAGE, cursor: this.cursor ?? undefined });
      const { body } = await api.get(url);
      if (id !== this.id) return;
      const fresh = body.items.filter((entry) => entry.seq > this.lastSeq);
      if (fresh.length) this.lastSeq = fresh[fresh.length - 1].seq;
      this.feed.append(fresh);
      if (body.next_cursor) this.cursor = body.next_cursor;
      else this.done = true;
    } finally {
      this.feed.busy(false);
    }
  }

  /** New entries were appended (a run ended): read on from the last page. */
  async refreshTail(total) {
    if (!this.id) return;
    this.feed.setTotal(total);
    if (this.done) {
      this.done = false;
      await this.more();
    }
  }
}
