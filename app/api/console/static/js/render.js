// One message (or transcript entry) as an <article> labelled by its kind: "user message",
// "assistant message", "tool call", "tool result", "compaction" (SPEC §13: the browser tests
// find them by these names). Text is set as text; nothing here builds markup from data.

import { badge, h } from "./dom.js";
import { count, plural, shorten, shortId, timeElement, usage } from "./format.js";

export const LABELS = {
  user: "user message",
  assistant: "assistant message",
  tool_call: "tool call",
  tool_result: "tool result",
  compaction: "compaction",
  system: "system prompt",
};

const FAILED_STOPS = new Set(["error", "aborted"]);

/** Did this assistant attempt end in error or abort (contract §3)? */
export function failedAttempt(message) {
  return message?.type === "assistant" && FAILED_STOPS.has(message.stop_reason);
}

function textBlock(text) {
  return h("div", { class: "text" }, text);
}

function imageBlock(block) {
  const source = block.source || {};
  if (source.type === "base64") {
    return h("img", {
      class: "image",
      src: `data:${source.media_type};base64,${source.data}`,
      alt: `image (${source.media_type})`,
      loading: "lazy",
    });
  }
  // never fetched: the page asks nothing of other origins
  return h("p", { class: "image-url" }, "Image at ", h("code", {}, source.url || "?"), " (not loaded)");
}

function thinkingBlock(block) {
  const text = block.thinking;
  return h(
    "details",
    { class: "thinking" },
    h("summary", {}, "Thinking", block.signature ? h("span", { class: "muted" }, " · signed") : null),
    text ? textBlock(text) : h("p", { class: "muted" }, "(empty)"),
  );
}

function redactedBlock(block) {
  return h(
    "details",
    { class: "thinking" },
    h("summary", {}, "Redacted thinking"),
    h("code", { class: "opaque" }, shorten(block.data, 400)),
  );
}

/** A tool call block: its own article, inside its assistant message, raw arguments shown. */
export function toolCallArticle(block, { pending, running } = {}) {
  return h(
    "article",
    { class: "tool-call", "aria-label": LABELS.tool_call },
    h(
      "header",
      { class: "msg-head" },
      h("span", { class: "who" }, "Tool call"),
      h("code", { class: "tool-name" }, block.name),
      h("span", { class: "muted", title: block.id }, block.id),
      block.server_label ? badge(block.server_label) : null,
      pending ? badge("pending", "warn") : null,
      running ? badge("running", "info") : null,
    ),
    h("pre", { class: "args", "aria-label": "arguments" }, block.arguments ?? ""),
  );
}

function contentBlocks(content, opts = {}) {
  return (content || []).map((block) => {
    switch (block.type) {
      case "text":
        return textBlock(block.text);
      case "image":
        return imageBlock(block);
      case "thinking":
        return thinkingBlock(block);
      case "redacted_thinking":
        return redactedBlock(block);
      case "tool_call":
        return toolCallArticle(block, {
          pending: opts.pending?.has(block.id),
          running: opts.running?.has(block.id),
        });
      default:
        return h("p", { class: "muted" }, `(${block.type} block)`);
    }
  });
}

function errorNote(error) {
  if (!error) return null;
  const text = [error.title, error.detail].filter(Boolean).join(": ") || error.message;
  return h("p", { class: "error-note" }, text || JSON.stringify(error));
}

/**
 * A message as an article. opts: failed (flag it), when / runId (shown), actions (nodes
 * for its footer), pending / running (Sets of tool call ids), live (still arriving).
 */
export function messageArticle(message, opts = {}) {
  const type = message.type;
  const label = LABELS[type] || `${type} message`;
  const failed = opts.failed || failedAttempt(message);
  const head = h("header", { class: "msg-head" });
  const body = h("div", { class: "msg-body" });
  const article = h(
    "article",
    { class: `msg msg-${type}${failed ? " failed" : ""}${opts.live ? " live" : ""}`, "aria-label": label },
    head,
    body,
  );
  if (type === "user") {
    head.append(h("span", { class: "who" }, "User"));
    body.append(...contentBlocks(message.content));
  } else if (type === "assistant") {
    head.append(h("span", { class: "who" }, "Assistant"));
    if (message.model) head.append(h("span", { class: "muted" }, message.model));
    if (failed) head.append(badge(message.stop_reason === "aborted" ? "aborted" : "failed", "bad"));
    else if (message.stop_reason && message.stop_reason !== "end_turn") {
      head.append(h("span", { class: "muted" }, message.stop_reason));
    }
    if (opts.live) head.append(badge("streaming", "info"));
    const blocks = contentBlocks(message.content, opts);
    body.append(...blocks);
    if (!blocks.length && !opts.live) body.append(h("p", { class: "muted" }, "(no content)"));
    const note = errorNote(message.error);
    if (note) body.append(note);
    if (message.usage && (message.usage.input_tokens || message.usage.output_tokens)) {
      head.append(h("span", { class: "muted usage" }, usage(message.usage)));
    }
  } else if (type === "tool_result") {
    head.append(
      h("span", { class: "who" }, "Tool result"),
      h("code", { class: "tool-name" }, message.tool_name),
      h("span", { class: "muted", title: message.tool_call_id }, message.tool_call_id),
    );
    if (message.is_error) head.append(badge("error", "bad"));
    if (opts.client) head.append(badge("from the client"));
    for (const block of message.content || []) {
      if (block.type === "text") body.append(h("pre", { class: "result" }, block.text));
      else body.append(...contentBlocks([block]));
    }
  } else {
    head.append(h("span", { class: "who" }, type));
    body.append(h("pre", { class: "result" }, JSON.stringify(message, null, 2)));
  }
  decorate(article, head, opts);
  return article;
}

function decorate(article, head, opts) {
  if (opts.runId) {
    head.append(h("span", { class: "muted run-ref", title: `run ${opts.runId}` }, `run ${shortId(opts.runId)}`));
  }
  if (opts.when) head.append(timeElement(opts.when));
  if (opts.actions?.length) head.append(h("span", { class: "msg-actions" }, opts.actions));
}

/** The context's summary: the messages compaction folded, as the model sees them now. */
export function summaryArticle(summary) {
  return h(
    "article",
    { class: "msg msg-compaction", "aria-label": LABELS.compaction },
    h("header", { class: "msg-head" }, h("span", { class: "who" }, "Compaction"), h("span", { class: "muted" }, "summary of the earlier messages")),
    h("div", { class: "msg-body" }, textBlock(summary)),
  );
}

export function systemArticle(prompt) {
  return h(
    "article",
    { class: "msg msg-system", "aria-label": LABELS.system },
    h("header", { class: "msg-head" }, h("span", { class: "who" }, "System prompt")),
    h("div", { class: "msg-body" }, textBlock(prompt)),
  );
}

/**
 * A compaction record: why, the summary, what it folded — the folded messages themselves (a
 * run record's or a run event's compaction), or their range (a transcript entry's: the
 * messages are earlier in the transcript).
 */
export function compactionArticle(record, opts = {}) {
  const folded = record.folded;
  let what;
  if (Array.isArray(folded)) {
    const list = h("ol", { class: "folded" });
    const details = h(
      "details",
      {
        class: "folded-list",
        ontoggle: () => {
          // drawn when opened (a compaction may fold thousands)
          if (details.open && !list.childElementCount) {
            for (const message of folded.slice(0, 500)) list.append(h("li", {}, foldedLine(message)));
            if (folded.length > 500) list.append(h("li", { class: "muted" }, `… and ${count(folded.length - 500)} more`));
          }
        },
      },
      h("summary", {}, `Folded ${plural(folded.length, "message")}`),
      list,
    );
    what = details;
  } else if (folded && typeof folded === "object") {
    const range = folded.count ? ` (context positions ${folded.from_position}–${folded.to_position - 1})` : "";
    what = h("p", { class: "muted" }, `Folded ${plural(folded.count ?? 0, "message")}${range}`);
  }
  const article = h(
    "article",
    { class: "msg msg-compaction", "aria-label": LABELS.compaction },
    h(
      "header",
      { class: "msg-head" },
      h("span", { class: "who" }, "Compaction"),
      record.reason ? badge(record.reason) : null,
      h("span", { class: "muted" }, `${count(record.tokens_before)} → ${count(record.tokens_after)} tokens`),
    ),
    h(
      "div",
      { class: "msg-body" },
      record.summary ? textBlock(record.summary) : h("p", { class: "muted" }, "(empty summary)"),
      what,
    ),
  );
  decorate(article, article.querySelector("header"), opts);
  return article;
}

/** One folded message in a line: its kind and the start of its text. */
export function foldedLine(message) {
  const texts = [];
  for (const block of message.content || []) {
    if (block.type === "text") texts.push(block.text);
    else if (block.type === "tool_call") texts.push(`${block.name}(${block.arguments})`);
    else if (block.type === "thinking") texts.push("[thinking]");
    else texts.push(`[${block.type}]`);
  }
  return `${LABELS[message.type] || message.type}: ${shorten(texts.join(" "), 160)}`;
}

function noteArticle(label, title, lines, opts = {}) {
  const article = h(
    "article",
    { class: "msg msg-note", "aria-label": label },
    h("header", { class: "msg-head" }, h("span", { class: "who" }, title)),
    h("div", { class: "msg-body" }, lines.filter(Boolean).map((line) => h("p", {}, line))),
  );
  decorate(article, article.querySelector("header"), opts);
  return article;
}

/**
 * A transcript entry (docs/contract.md "Transcript") as an article. opts.openConversation(id)
 * follows a fork's source.
 */
export function transcriptArticle(entry, opts = {}) {
  const meta = { runId: entry.run_id, when: entry.created_at, actions: opts.actions };
  const body = entry.body || {};
  switch (entry.kind) {
    case "prompt":
    case "attempt":
    case "tool_result":
      return messageArticle(body, { ...meta, failed: entry.failed });
    case "client_result":
      return messageArticle(body, { ...meta, client: true });
    case "compaction":
      return compactionArticle(body, meta);
    case "approval":
      return noteArticle(
        "approval",
        body.approve ? "Approved" : "Denied",
        [`${body.tool_name || "call"} ${body.tool_call_id || ""}`, body.reason ? `Reason: ${body.reason}` : null],
        meta,
      );
    case "pause": {
      const calls = body.tool_calls || [];
      return noteArticle(
        "pause",
        "Paused for the application",
        calls.map((c) => `${c.kind === "approval" ? "awaits approval" : "awaits a result"}: ${c.name}(${shorten(c.arguments, 80)})`),
        meta,
      );
    }
    case "context_replaced": {
      const context = body.context || {};
      return noteArticle(
        "context replaced",
        "Context replaced",
        [
          `${plural((context.messages || []).length, "message")}${context.summary ? ", with a summary" : ""}`,
          context.system_prompt ? `System prompt: ${shorten(context.system_prompt, 160)}` : null,
        ],
        meta,
      );
    }
    case "item_deleted":
      return noteArticle("item deleted", "Items deleted", (body.items || []).map((id) => `deleted: ${id}`), meta);
    case "forked": {
      const article = noteArticle(
        "fork",
        "Forked",
        [`from ${body.source_id} (${body.messages === null || body.messages === undefined ? "whole context" : plural(body.messages, "message")})`],
        meta,
      );
      if (opts.openConversation && body.source_id) {
        article.querySelector(".msg-body").append(
          h("button", { type: "button", class: "link", onclick: () => opts.openConversation(body.source_id) }, `Open ${body.source_id}`),
        );
      }
      return article;
    }
    case "item_deleted":
      return noteArticle("item deleted", "Item deleted", [body.item_id ? `item ${body.item_id}` : null, JSON.stringify(body)], meta);
    default:
      return noteArticle(entry.kind, entry.kind, [JSON.stringify(body)], meta);
  }
}
