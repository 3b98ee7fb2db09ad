// Continuing a conversation: the "Message" box with "Send" (and "Cancel run" while a run is
// in progress), and the pending tool calls answered from a form: "Approve" / "Deny" for an
// approval, a result for a client call (docs/tools.md).

import { badge, field, h } from "./dom.js";
import { plural } from "./format.js";

export class Composer {
  constructor({ onSend, onCancel }) {
    this.onSend = onSend;
    this.onCancel = onCancel;
    this.text = h("textarea", { rows: 2, placeholder: "Write a message — Enter sends, Shift+Enter adds a line", spellcheck: "true" });
    this.text.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        this.form.requestSubmit();
      }
    });
    this.agent = h("select", {});
    this.send = h("button", { type: "submit", class: "primary" }, "Send");
    this.cancel = h("button", { type: "button", class: "danger", hidden: true, onclick: () => this.onCancel() }, "Cancel run");
    this.hint = h("p", { class: "hint composer-hint", id: "composer-hint" });
    this.form = h(
      "form",
      { class: "composer", "aria-label": "Continue the conversation", onsubmit: (event) => this.submit(event) },
      field("Message", this.text),
      h("div", { class: "composer-row" }, field("Agent", this.agent), h("div", { class: "composer-buttons" }, this.cancel, this.send)),
      this.hint,
    );
    this.element = this.form;
    this.running = false;
    this.blocked = "";
  }

  setAgents(names, selected) {
    this.agent.replaceChildren(...names.map((name) => h("option", { value: name, selected: name === selected }, name)));
    this.agent.closest(".field").hidden = names.length < 2;
  }

  /** Choose this agent for the next run, when the server has it. */
  selectAgent(name) {
    if ([...this.agent.options].some((option) => option.value === name)) this.agent.value = name;
  }

  /** A run is in progress (ours or another's): Send waits, Cancel shows. */
  setRunning(running, cancellable) {
    this.running = running;
    this.cancel.hidden = !cancellable;
    this.refresh();
  }

  /** Why Send cannot be used now ("" when it can). */
  setBlocked(reason) {
    this.blocked = reason;
    this.refresh();
  }

  refresh() {
    const reason = this.blocked; // during a run a message waits for its end (ConversationView.run)
    this.send.disabled = Boolean(reason);
    this.hint.textContent = reason;
    if (reason) this.send.setAttribute("aria-describedby", this.hint.id);
    else this.send.removeAttribute("aria-describedby");
  }

  submit(event) {
    event.preventDefault();
    const text = this.text.value;
    if (!text.trim() || this.send.disabled) return;
    // cleared now (the next message may be typed while this one runs); given back if the
    // server refused the run and nothing new was typed meanwhile
    this.text.value = "";
    this.onSend(text, this.agent.value || "default").then((sent) => {
      if (!sent && !this.text.value) this.text.value = text;
    });
  }
}

/** The calls the stored context waits on, each answered here; sent together once all are. */
export class PendingCalls {
  constructor({ onAnswer }) {
    this.onAnswer = onAnswer;
    this.calls = [];
    this.answers = new Map();
    this.key = "";
    this.list = h("div", { class: "pending-list" });
    this.heading = h("h3", { id: "pending-heading" }, "Waiting for you");
    this.element = h("section", { class: "pending", "aria-labelledby": "pending-heading", hidden: true }, this.heading, this.list);
  }

  /** The conversation's pending_tool_calls (redrawn only when they changed). */
  set(calls) {
    const key = calls.map((c) => `${c.id}:${c.kind}`).join(",");
    if (key === this.key) return;
    this.key = key;
    this.calls = calls;
    this.answers = new Map();
    this.element.hidden = !calls.length;
    this.heading.textContent = calls.length > 1 ? `${plural(calls.length, "tool call")} wait for you` : "A tool call waits for you";
    this.list.replaceChildren(...calls.map((call) => this.callForm(call)));
  }

  callForm(call) {
    const status = h("p", { class: "answer-status", role: "status" });
    const head = h(
      "div",
      { class: "pending-head" },
      h("code", { class: "tool-name" }, call.name),
      badge(call.kind === "approval" ? "needs approval" : "needs a result", "warn"),
      h("span", { class: "muted", title: call.id }, call.id),
    );
    const args = h("pre", { class: "args", "aria-label": "arguments" }, call.arguments ?? "");
    let controls;
    if (call.kind === "approval") {
      const reason = h("input", { type: "text", autocomplete: "off" });
      controls = h(
        "div",
        { class: "pending-controls" },
        field("Reason (optional)", reason),
        h(
          "div",
          { class: "row" },
          h("button", { type: "button", class: "primary", onclick: () => this.answer(call, { tool_call_id: call.id, approve: true }, status, "Approved") }, "Approve"),
          h(
            "button",
            {
              type: "button",
              class: "danger",
              onclick: () => {
                const decision = { tool_call_id: call.id, approve: false };
                if (reason.value.trim()) decision.reason = reason.value.trim();
                this.answer(call, decision, status, "Denied");
              },
            },
            "Deny",
          ),
        ),
      );
    } else {
      const result = h("textarea", { rows: 2 });
      const failed = h("input", { type: "checkbox" });
      controls = h(
        "form",
        {
          class: "pending-controls",
          onsubmit: (event) => {
            event.preventDefault();
            const message = {
              type: "tool_result",
              tool_call_id: call.id,
              tool_name: call.name,
              content: [{ type: "text", text: result.value }],
              is_error: failed.checked,
            };
            this.answer(call, message, status, "Result given");
          },
        },
        field("Result", result),
        h("label", { class: "check" }, failed, "The call failed (is_error)"),
        h("div", { class: "row" }, h("button", { type: "submit", class: "primary" }, "Send result")),
      );
    }
    return h("div", { class: "pending-call", role: "group", "aria-label": `${call.name} ${call.id}` }, head, args, controls, status);
  }

  answer(call, value, status, said) {
    this.answers.set(call.id, { call, value });
    const left = this.calls.length - this.answers.size;
    status.textContent = left ? `${said}. ${plural(left, "call")} still to answer.` : `${said}. Sending…`;
    if (left === 0) {
      const results = [];
      const approvals = [];
      for (const pending of this.calls) {
        const { call: c, value: v } = this.answers.get(pending.id);
        if (c.kind === "approval") approvals.push(v);
        else results.push(v);
      }
      this.onAnswer(results, approvals).then((sent) => {
        if (!sent) {
          this.answers.clear();
          status.textContent = "Not sent; answer again.";
        }
      });
    }
  }
}
