// One conversation: its header and actions, the views (context, transcript, runs, versions,
// details) as tabs, the pending calls and the composer, and the runs as they happen — ours
// (a POST streamed as server-sent events) and those started elsewhere (found by polling the
// conversation, then read from the run's stored event stream).

import * as api from "./api.js";
import { badge, fill, h } from "./dom.js";
import { plural, shortId } from "./format.js";
import { Composer, PendingCalls } from "./composer.js";
import { DetailsPanel, RunsPanel, VersionsPanel } from "./panels.js";
import { ContextTimeline, LiveRun, TranscriptTimeline } from "./timeline.js";

/** How often an open conversation is looked at for runs started elsewhere (ms). */
const POLL_MS = 1500;

export class ConversationView {
  constructor(app) {
    this.app = app;
    this.id = null;
    this.conversation = null;
    this.live = null; // the LiveRun drawn now
    this.sending = false; // our own POST is in flight
    this.watching = null; // the run id whose events we read
    this.abort = null;
    this.timer = 0;
    this.polling = false;
    this.versions = null; // this server keeps versions: null until probed
    this.queued = null; // a message typed while a run was in progress

    this.title = h("h2", { id: "conversation-title", tabIndex: -1 });
    this.summary = h("p", { class: "conversation-summary muted" });
    this.actions = h(
      "div",
      { class: "actions" },
      h("button", { type: "button", class: "quiet back", onclick: () => app.showList() }, "Back to conversations"),
      h("button", { type: "button", class: "quiet", onclick: () => this.refresh(true) }, "Refresh"),
      h("button", { type: "button", class: "quiet", onclick: () => this.compact() }, "Compact"),
      h("button", { type: "button", class: "quiet", onclick: () => this.export() }, "Export"),
      h("button", { type: "button", class: "danger", onclick: () => this.remove() }, "Delete"),
    );
    this.alert = h("div", { class: "alert", role: "alert", hidden: true });
    this.status = h("p", { class: "run-status muted", role: "status", "aria-live": "polite" });

    this.context = new ContextTimeline({ forkAt: (n) => this.fork({ messages: n }) });
    this.transcript = new TranscriptTimeline({ openConversation: (id) => app.open(id) });
    this.runs = new RunsPanel({ onError: (e) => this.showError(e), onCancel: (runId) => this.cancel(runId) });
    this.versionsPanel = new VersionsPanel({ onError: (e) => this.showError(e), onFork: (version) => this.fork({ version }) });
    this.details = new DetailsPanel({ onError: (e) => this.showError(e), onChanged: (c) => this.setConversation(c) });

    this.tabs = [
      { name: "context", label: "Context", element: this.context.element },
      { name: "transcript", label: "Transcript", element: this.transcript.element, show: () => this.showTranscript() },
      { name: "runs", label: "Runs", element: this.runs.element, show: () => this.runs.show() },
      { name: "versions", label: "Versions", element: this.versionsPanel.element, show: () => this.versionsPanel.show() },
      { name: "details", label: "Details", element: this.details.element },
    ];
    this.tablist = h("div", { class: "tabs", role: "tablist", "aria-label": "Views of the conversation" });
    this.panels = h("div", { class: "panels" });
    for (const tab of this.tabs) {
      tab.button = h(
        "button",
        { type: "button", role: "tab", id: `tab-${tab.name}`, "aria-controls": `panel-${tab.name}`, "aria-selected": "false", tabIndex: -1, onclick: () => this.select(tab.name) },
        tab.label,
      );
      tab.panel = h("div", { class: "panel", role: "tabpanel", id: `panel-${tab.name}`, "aria-labelledby": tab.button.id, hidden: true }, tab.element);
      this.tablist.append(tab.button);
      this.panels.append(tab.panel);
    }
    this.tablist.addEventListener("keydown", (event) => this.tabKey(event));
    this.transcriptOpened = false;

    this.pending = new PendingCalls({ onAnswer: (results, approvals) => this.run(results, approvals, this.composer.agent.value || "default") });
    this.composer = new Composer({ onSend: (text, agent) => this.run([text], [], agent), onCancel: () => this.cancel() });

    this.element = h(
      "section",
      { class: "conversation", "aria-labelledby": "conversation-title" },
      h("header", { class: "conversation-head" }, h("div", { class: "titles" }, this.title, this.summary), this.actions),
      this.alert,
      this.tablist,
      this.panels,
      h("div", { class: "bottom" }, this.status, this.pending.element, this.composer.element),
    );
    this.select("context");
    document.addEventListener("visibilitychange", () => {
      if (!document.hidden) this.poll();
    });
  }

  // --- opening ----------------------------------------------------------------------------

  async open(id) {
    this.close();
    this.id = id;
    this.conversation = null;
    this.transcriptOpened = false;
    fill(this.title, id);
    this.summary.textContent = "Reading…";
    this.hideError();
    this.status.textContent = "";
    this.runs.open(id);
    this.versionsPanel.open(id);
    this.pending.set([]);
    try {
      const { body } = await api.get(api.conversationPath(id));
      if (id !== this.id) return;
      this.setConversation(body);
      await this.context.load(id, body.pending_tool_calls);
      if (this.versions === null) this.versions = await VersionsPanel.supported(id);
      this.tabs.find((t) => t.name === "versions").button.hidden = !this.versions;
      const current = this.tabs.find((t) => t.selected);
      if (current.name === "versions" && !this.versions) this.select("context");
      else if (current.show) await current.show();
      if (body.active_run_id) this.watch(body.active_run_id);
    } catch (error) {
      if (error.status === 404) {
        this.summary.textContent = "No such conversation (deleted, expired, or never created).";
        this.context.feed.setItems([]);
      }
      this.showError(error);
    }
    this.timer = setInterval(() => this.poll(), POLL_MS);
  }

  close() {
    clearInterval(this.timer);
    this.timer = 0;
    this.abort?.abort();
    this.abort = null;
    this.watching = null;
    this.live = null;
    this.sending = false;
    this.queued = null;
    this.composer.setRunning(false, false);
  }

  setConversation(conversation) {
    this.conversation = conversation;
    const calls = conversation.pending_tool_calls || [];
    fill(
      this.summary,
      plural(conversation.message_count, "message"),
      conversation.has_summary ? " after a summary" : "",
      ` · ${plural(conversation.run_count, "run")}`,
      conversation.active_run_id ? [" ", badge(`running ${shortId(conversation.active_run_id)}`, "info")] : "",
      calls.length ? [" ", badge(`${calls.length} pending`, "warn")] : "",
    );
    this.pending.set(this.sending || this.watching ? [] : calls);
    this.composer.setBlocked(calls.length ? "Answer the pending tool calls above first." : "");
    this.details.show(conversation);
  }

  // --- tabs -------------------------------------------------------------------------------

  select(name) {
    for (const tab of this.tabs) {
      const on = tab.name === name;
      tab.selected = on;
      tab.button.setAttribute("aria-selected", on ? "true" : "false");
      tab.button.tabIndex = on ? 0 : -1;
      tab.panel.hidden = !on;
    }
    const tab = this.tabs.find((t) => t.name === name);
    if (name === "context") this.context.feed.update();
    if (this.id && tab.show) tab.show();
  }

  tabKey(event) {
    const visible = this.tabs.filter((t) => !t.button.hidden);
    const at = visible.findIndex((t) => t.selected);
    const moves = { ArrowRight: at + 1, ArrowLeft: at - 1, Home: 0, End: visible.length - 1 };
    if (!(event.key in moves)) return;
    event.preventDefault();
    const next = visible[(moves[event.key] + visible.length) % visible.length];
    this.select(next.name);
    next.button.focus();
  }

  async showTranscript() {
    if (!this.transcriptOpened) {
      this.transcriptOpened = true;
      await this.transcript.open(this.id, this.conversation?.transcript_count ?? null).catch((e) => this.showError(e));
    } else {
      this.transcript.feed.update();
    }
  }

  // --- runs -------------------------------------------------------------------------------

  /** A run of `prompts` (texts, or tool results first) and `approvals`, streamed; sent? */
  async run(prompts, approvals, agent) {
    if (!this.id) return false;
    if (this.sending || this.watching) {
      // typed while a run is in progress: sent when it ends (one message waits at most)
      if (this.queued || approvals.length) return false;
      this.queued = { prompts, agent };
      this.status.textContent = "Your message will be sent when the run in progress ends.";
      return true;
    }
    this.hideError();
    this.sending = true;
    this.pending.set([]);
    const body = { prompts, agent };
    if (approvals.length) body.approvals = approvals;
    const live = new LiveRun();
    this.live = live;
    this.abort = new AbortController();
    this.composer.setRunning(true, false);
    this.status.textContent = "Starting the run…";
    let sent = false;
    try {
      const stream = api.events("POST", api.conversationPath(this.id, "runs"), {
        json: body,
        headers: { Prefer: "return=minimal" },
        signal: this.abort.signal,
      });
      sent = true;
      await this.follow(stream, live);
    } catch (error) {
      if (error.name !== "AbortError") this.showError(error);
      if (error instanceof api.ApiProblem) sent = false; // refused: nothing ran, keep the text
    } finally {
      this.sending = false;
      await this.settle(live);
    }
    return sent;
  }

  /** Read a run from another client: its stored events, live. */
  async watch(runId) {
    if (this.sending || this.watching) return;
    const id = this.id;
    this.watching = runId;
    const live = new LiveRun();
    live.runId = runId;
    this.live = live;
    this.abort = new AbortController();
    this.composer.setRunning(true, true);
    this.status.textContent = `A run started elsewhere is in progress (${shortId(runId)})…`;
    try {
      const stream = api.events("GET", api.conversationPath(id, "runs", runId, "events"), { signal: this.abort.signal });
      await this.follow(stream, live);
    } catch (error) {
      if (error.name !== "AbortError" && error.status !== 410) this.showError(error);
    } finally {
      if (this.watching === runId) this.watching = null;
      if (id === this.id) await this.settle(live);
    }
  }

  async follow(stream, live) {
    for await (const event of stream) {
      if (live !== this.live) return;
      const changed = live.take(event);
      if (event.event === "run.started") {
        this.composer.setRunning(true, true);
        this.status.textContent = "Running…";
      }
      if (changed) {
        this.context.showLive(live);
        if (live.partial?.size) this.status.textContent = "Answer arriving…";
      }
      if (event.event === "run.finished") this.status.textContent = describeRun(event.data);
      if (event.event === "error") this.showError(new api.ApiProblem(event.data.status || 500, event.data));
    }
  }

  /** A run ended (or its stream did): show the stored state it left. */
  async settle(live) {
    if (live !== this.live) return;
    this.live = null;
    this.abort = null;
    this.composer.setRunning(false, false);
    if (live.record?.agent) this.composer.selectAgent(live.record.agent); // answers go to it too
    await this.refresh(false, live.record);
    this.runs.stale = true;
    this.versionsPanel.stale = true;
    this.app.list.load();
    this.sendQueued();
  }

  /** The message typed during the last run: sent now, unless the run left calls to answer. */
  sendQueued() {
    const queued = this.queued;
    this.queued = null;
    if (!queued) return;
    if (this.conversation?.pending_tool_calls?.length) {
      if (!this.composer.text.value) this.composer.text.value = queued.prompts.join("\n");
      this.status.textContent = "Your message was not sent: answer the pending tool calls first.";
      return;
    }
    this.run(queued.prompts, [], queued.agent);
  }

  /** Read the conversation again and show what changed (O(what changed) when it can). */
  async refresh(userAsked = false, record = null) {
    if (!this.id) return;
    const id = this.id;
    try {
      const { body } = await api.get(api.conversationPath(id));
      if (id !== this.id) return;
      this.setConversation(body);
      if (!this.context.applyRun(record, body)) await this.context.load(id, body.pending_tool_calls);
      else this.context.setPending(body.pending_tool_calls || []);
      this.context.clearLive();
      if (this.transcriptOpened) await this.transcript.refreshTail(body.transcript_count);
      if (userAsked) {
        this.runs.stale = true;
        this.versionsPanel.stale = true;
        const current = this.tabs.find((t) => t.selected);
        if (current.show) await current.show();
      }
    } catch (error) {
      this.showError(error);
    }
  }

  /** Look at the conversation: a run started elsewhere is watched, a change is shown. */
  async poll() {
    if (!this.id || this.polling || this.sending || this.watching || document.hidden) return;
    this.polling = true;
    const id = this.id;
    try {
      const { body } = await api.get(api.conversationPath(id));
      if (id !== this.id || this.sending || this.watching) return;
      const before = this.conversation;
      this.setConversation(body);
      if (body.active_run_id) this.watch(body.active_run_id);
      else if (!before || body.etag !== this.context.etag) await this.refresh();
      else if (this.transcriptOpened && body.transcript_count !== before.transcript_count) await this.transcript.refreshTail(body.transcript_count);
    } catch (error) {
      if (error.status === 404) this.showError(error);
    } finally {
      this.polling = false;
    }
  }

  async cancel(runId = null) {
    const target = runId || this.live?.runId || this.conversation?.active_run_id;
    if (!target) return;
    const live = this.live;
    if (live && live.runId === target) this.status.textContent = "Cancel asked…";
    try {
      await api.post(api.conversationPath(this.id, "runs", target, "cancel"));
      if (runId) {
        this.runs.stale = true;
        await this.runs.show();
      }
    } catch (error) {
      if (error.slug !== "run-not-active") this.showError(error);
    }
  }

  // --- actions ----------------------------------------------------------------------------

  async fork(body) {
    try {
      const { body: created } = await api.post(api.conversationPath(this.id, "fork"), body);
      this.app.toast(`Forked into ${created.id}`);
      await this.app.list.load();
      this.select("context"); // the fork opens on what it holds
      this.app.open(created.id);
    } catch (error) {
      this.showError(error);
    }
  }

  async compact() {
    try {
      this.status.textContent = "Compacting…";
      const { body } = await api.post(api.conversationPath(this.id, "compact"), {}, { headers: { Prefer: "return=minimal" } });
      this.status.textContent = describeRun(body);
      await this.refresh(true);
    } catch (error) {
      this.status.textContent = "";
      this.showError(error);
    }
  }

  async export() {
    try {
      await api.download(api.conversationPath(this.id, "export"), `${this.id}.json`);
      this.status.textContent = `Exported ${this.id}.json`;
    } catch (error) {
      this.showError(error);
    }
  }

  async remove() {
    const id = this.id;
    const yes = await this.app.confirm(`Delete ${id}?`, "The conversation and all its records (runs, transcript) are deleted. This cannot be undone.", "Delete");
    if (!yes) return;
    try {
      await api.request("DELETE", api.conversationPath(id));
      this.close();
      this.app.toast(`Deleted ${id}`);
      await this.app.list.load();
      this.app.open(null);
      this.app.list.element.querySelector("button")?.focus(); // focus was on the view just removed
    } catch (error) {
      this.showError(error);
    }
  }

  showError(error) {
    const problem = error instanceof api.ApiProblem ? error : null;
    fill(
      this.alert,
      h("strong", {}, problem ? problem.title : "Something went wrong"),
      h("span", {}, ` ${error.message}`),
      h("button", { type: "button", class: "quiet small", onclick: () => this.hideError() }, "Dismiss"),
    );
    this.alert.hidden = false;
  }

  hideError() {
    this.alert.hidden = true;
    this.alert.replaceChildren();
  }
}

function describeRun(run) {
  if (!run) return "";
  const parts = [`Run ${run.status.replace("_", " ")}`];
  if (run.duration_ms !== null && run.duration_ms !== undefined) parts.push(`in ${run.duration_ms} ms`);
  if (run.error?.detail) parts.push(`— ${run.error.detail}`);
  return parts.join(" ");
}
