// The console: asks for an API key when the server wants one (kept in sessionStorage, for this
// browser session only), then shows the conversations and the one opened (#/c/<id>).

import * as api from "./api.js";
import { field, fill, h } from "./dom.js";
import { ConversationView } from "./conversation.js";
import { ConversationList } from "./list.js";

class App {
  constructor(root) {
    this.root = root;
    this.started = false;
    this.live = h("div", { class: "visually-hidden", role: "status", "aria-live": "polite" });
    this.keyStatus = h("div", { class: "key-status" });
    document.body.append(this.live);
    api.whenUnauthorized(() => this.askKey("The server refused the API key. Give a valid one."));
  }

  /** Is a key needed, and is the one we hold good? Then start, else ask. */
  async boot() {
    try {
      await api.get(api.query("/conversations", { limit: 1 }));
      this.start();
    } catch (error) {
      if (error.status === 401) return; // askKey was called
      fill(this.root, h("div", { class: "gate" }, h("h2", {}, "The server could not be reached"), h("p", {}, error.message), h("button", { type: "button", onclick: () => this.boot() }, "Try again")));
    }
  }

  askKey(message) {
    const hadKey = Boolean(api.storedKey());
    api.forgetKey();
    this.started = false;
    this.view?.close();
    this.view = null;
    const input = h("input", { type: "password", autocomplete: "off", spellcheck: "false", required: true });
    const error = h("p", { class: "error-note", role: "alert" }, hadKey ? message : "");
    const form = h(
      "form",
      {
        class: "gate",
        "aria-labelledby": "gate-title",
        onsubmit: async (event) => {
          event.preventDefault();
          const key = input.value.trim();
          if (!key) return;
          api.storeKey(key);
          error.textContent = "Checking…";
          await this.boot();
        },
      },
      h("h2", { id: "gate-title" }, "This server needs an API key"),
      h("p", { class: "muted" }, "The key is kept for this browser session only, and sent to this server alone (Authorization: Bearer)."),
      field("API key", input),
      h("button", { type: "submit", class: "primary" }, "Open the console"),
      error,
    );
    fill(this.root, form);
    this.keyStatus.replaceChildren();
    input.focus();
  }

  start() {
    if (this.started) return;
    this.started = true;
    this.list = new ConversationList({
      onCreate: () => this.create(),
      onError: (error) => this.toast(error.message),
    });
    this.view = new ConversationView(this);
    this.welcome = h(
      "section",
      { class: "welcome", "aria-labelledby": "welcome-title" },
      h("h2", { id: "welcome-title" }, "No conversation open"),
      h("p", { class: "muted" }, "Pick one from the list, or start a new one."),
    );
    this.main = h("main", { class: "main", id: "main" }, this.welcome);
    fill(this.root, h("div", { class: "layout" }, this.list.element, this.main));
    if (api.storedKey()) {
      this.keyStatus.replaceChildren(h("button", { type: "button", class: "quiet small", onclick: () => this.forget() }, "Forget key"));
    }
    this.list.load();
    this.loadAgents();
    window.addEventListener("hashchange", () => this.route());
    this.route();
  }

  /** The agent profiles a run may name (GET /readyz lists them, ready or not). */
  async loadAgents() {
    let readiness;
    try {
      readiness = (await api.get("/readyz")).body;
    } catch (error) {
      readiness = error.problem; // 503 not ready: the same document
    }
    const names = Object.keys(readiness?.profiles || {}).sort((a, b) => (a === "default" ? -1 : b === "default" ? 1 : a.localeCompare(b)));
    this.view.composer.setAgents(names.length ? names : ["default"], "default");
  }

  forget() {
    api.forgetKey();
    location.hash = "";
    location.reload();
  }

  route() {
    if (!this.started) return;
    const found = /^#\/c\/(.+)$/.exec(location.hash);
    const id = found ? decodeURIComponent(found[1]) : null;
    if (id === this.view.id && id !== null) return;
    this.list.select(id);
    if (id === null) {
      this.view.close();
      this.view.id = null;
      fill(this.main, this.welcome);
      this.showList();
      return;
    }
    fill(this.main, this.view.element);
    document.body.dataset.pane = "conversation";
    this.view.open(id).then(() => {
      if (document.activeElement === document.body) this.view.composer.text.focus({ preventScroll: true });
    });
  }

  /** Open a conversation (null: none). */
  open(id) {
    const hash = id === null ? "" : `#/c/${encodeURIComponent(id)}`;
    if (location.hash === hash) this.route();
    else location.hash = hash;
  }

  showList() {
    document.body.dataset.pane = "list";
    this.list.element.querySelector("a[aria-current]")?.focus();
  }

  async create() {
    try {
      const { body } = await api.post("/conversations", {});
      this.toast(`Created ${body.id}`);
      await this.list.load();
      this.open(body.id);
      this.view.composer.text.focus();
    } catch (error) {
      this.toast(error.message);
    }
  }

  /** A short message for screen readers and eyes. */
  toast(text) {
    this.live.textContent = text;
    const note = h("div", { class: "toast", "aria-hidden": "true" }, text);
    document.body.append(note);
    setTimeout(() => note.remove(), 4000);
  }

  /** A modal question: resolves true when `yes` was pressed. */
  confirm(title, text, yes) {
    return new Promise((resolve) => {
      const dialog = h(
        "dialog",
        { class: "confirm", "aria-labelledby": "confirm-title", "aria-describedby": "confirm-text" },
        h("h2", { id: "confirm-title" }, title),
        h("p", { id: "confirm-text" }, text),
        h(
          "form",
          { method: "dialog", class: "row" },
          h("button", { value: "no", class: "quiet", autofocus: true }, "Cancel"),
          h("button", { value: "yes", class: "danger" }, yes),
        ),
      );
      dialog.addEventListener("close", () => {
        resolve(dialog.returnValue === "yes");
        dialog.remove();
      });
      document.body.append(dialog);
      dialog.showModal();
    });
  }
}

const app = new App(document.getElementById("app"));
document.getElementById("key-status").replaceWith(app.keyStatus);
app.boot();
