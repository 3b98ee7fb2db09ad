// The conversations: a list labelled "Conversations" with search (an id, metadata filters),
// three views (recently updated, pending action, active), paging, and "New conversation".

import * as api from "./api.js";
import { badge, field, fill, h } from "./dom.js";
import { plural, shorten, timeElement } from "./format.js";

const PAGE = 30;
const VIEWS = [
  ["recent", "Recently updated"],
  ["pending", "Pending action"],
  ["active", "Running"],
];

/** "topic=billing user=u-17" (or comma-separated) → [["topic", "billing"], …]; bad parts named. */
export function parseFilters(text) {
  const pairs = [];
  const bad = [];
  for (const part of text.split(/[\s,]+/).filter(Boolean)) {
    const eq = part.indexOf("=");
    if (eq <= 0) bad.push(part);
    else pairs.push([part.slice(0, eq), part.slice(eq + 1)]);
  }
  return { pairs, bad };
}

export class ConversationList {
  constructor({ onCreate, onError }) {
    this.onCreate = onCreate;
    this.onError = onError;
    this.view = "recent";
    this.filters = [];
    this.idSearch = "";
    this.cursor = null;
    this.current = null;
    this.loading = false;

    this.idInput = h("input", { type: "search", autocomplete: "off", spellcheck: "false", placeholder: "exact id" });
    this.filterInput = h("input", { type: "search", autocomplete: "off", spellcheck: "false", placeholder: "key=value …" });
    const search = h(
      "form",
      { class: "search", role: "search", "aria-label": "Search conversations", onsubmit: (e) => this.search(e) },
      field("Conversation id", this.idInput),
      field("Metadata filters", this.filterInput, { hint: "key=value, all must match" }),
      h("div", { class: "row" }, h("button", { type: "submit" }, "Search"), h("button", { type: "button", class: "quiet", onclick: () => this.clear() }, "Clear")),
    );
    const views = h(
      "fieldset",
      { class: "views" },
      h("legend", {}, "Show"),
      VIEWS.map(([value, text]) => {
        const input = h("input", { type: "radio", name: "view", value, checked: value === this.view, onchange: () => this.setView(value) });
        return h("label", { class: "view-option" }, input, text);
      }),
    );
    this.list = h("ul", { class: "conversations", "aria-label": "Conversations" });
    this.status = h("p", { class: "list-status muted", role: "status" });
    this.more = h("button", { type: "button", class: "quiet more", hidden: true, onclick: () => this.load({ more: true }) }, "Load more");
    this.element = h(
      "nav",
      { class: "sidebar", "aria-label": "Conversations" },
      h(
        "div",
        { class: "sidebar-head" },
        h("button", { type: "button", class: "primary", onclick: () => this.onCreate() }, "New conversation"),
        h("button", { type: "button", class: "quiet", onclick: () => this.load(), title: "Read the list again" }, "Refresh"),
      ),
      search,
      views,
      this.list,
      this.more,
      this.status,
    );
  }

  search(event) {
    event.preventDefault();
    const { pairs, bad } = parseFilters(this.filterInput.value);
    if (bad.length) {
      this.status.textContent = `Not a key=value filter: ${bad.join(", ")}`;
      return;
    }
    this.filters = pairs;
    this.idSearch = this.idInput.value.trim();
    this.load();
  }

  clear() {
    this.idInput.value = "";
    this.filterInput.value = "";
    this.filters = [];
    this.idSearch = "";
    this.load();
  }

  setView(view) {
    this.view = view;
    this.load();
  }

  select(id) {
    this.current = id;
    for (const link of this.list.querySelectorAll("a[data-id]")) {
      if (link.dataset.id === id) link.setAttribute("aria-current", "page");
      else link.removeAttribute("aria-current");
    }
  }

  /** Read the first page (again), or the next one (`more`). A newer read supersedes an older
   * one still on its way (its answer is dropped). */
  async load({ more = false } = {}) {
    if (more && this.loading) return;
    const generation = (this.generation = (this.generation || 0) + 1);
    this.loading = true;
    this.list.setAttribute("aria-busy", "true");
    try {
      if (this.idSearch) {
        await this.loadOne(this.idSearch, generation);
        return;
      }
      const params = { limit: PAGE, cursor: more ? this.cursor : undefined };
      if (this.view === "pending") params.has_pending_action = "true";
      if (this.view === "active") params.active = "true";
      for (const [key, value] of this.filters) params[`metadata.${key}`] = value;
      const { body } = await api.get(api.query("/conversations", params));
      if (generation !== this.generation) return;
      if (!more) this.list.replaceChildren();
      for (const item of body.items) this.list.append(this.item(item));
      this.cursor = body.next_cursor;
      this.more.hidden = !this.cursor;
      const shown = this.list.childElementCount;
      this.status.textContent = shown ? `${plural(shown, "conversation")} shown${this.cursor ? " (more to load)" : ""}` : "No conversations match.";
    } catch (error) {
      if (generation === this.generation) this.onError(error);
    } finally {
      if (generation === this.generation) {
        this.loading = false;
        this.list.setAttribute("aria-busy", "false");
      }
    }
  }

  async loadOne(id, generation) {
    this.more.hidden = true;
    try {
      const { body } = await api.get(api.conversationPath(id));
      if (generation !== this.generation) return;
      fill(this.list, this.item(body));
      this.status.textContent = "1 conversation found by its id.";
    } catch (error) {
      if (error.status !== 404) throw error;
      if (generation !== this.generation) return;
      this.list.replaceChildren();
      this.status.textContent = `No conversation with the id ${id}.`;
    }
  }

  item(conversation) {
    const pending = conversation.pending_tool_calls?.length || 0;
    const metadata = Object.entries(conversation.metadata || {});
    const link = h(
      "a",
      {
        href: `#/c/${encodeURIComponent(conversation.id)}`,
        class: "conversation-link",
        dataset: { id: conversation.id },
        "aria-current": conversation.id === this.current ? "page" : null,
      },
      h("span", { class: "conversation-id" }, conversation.id),
      h(
        "span",
        { class: "conversation-meta" },
        timeElement(conversation.updated_at),
        h("span", {}, plural(conversation.message_count, "message")),
        conversation.active_run_id ? badge("running", "info") : null,
        pending ? badge(`${pending} pending`, "warn") : null,
      ),
      metadata.length
        ? h("span", { class: "conversation-tags" }, metadata.slice(0, 4).map(([k, v]) => h("span", { class: "tag" }, `${k}=${shorten(v, 24)}`)))
        : null,
    );
    return h("li", {}, link);
  }
}
