// Building the page's elements. Text always goes in as text (textContent), never as markup:
// nothing a message holds can become HTML.

/**
 * h("button", {class: "x", onclick: f, "aria-label": "…"}, "text", child, …) → the element.
 * Attributes: class, text, dataset (object), on<event> (a function), hidden / disabled /
 * checked / value / … (a boolean or value: set as a property), anything else: setAttribute.
 */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") el.className = value;
    else if (name === "text") el.textContent = value;
    else if (name === "dataset") Object.assign(el.dataset, value);
    else if (name.startsWith("on") && typeof value === "function") {
      el.addEventListener(name.slice(2), value);
    } else if (name in PROPERTIES) el[PROPERTIES[name]] = value;
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

const PROPERTIES = {
  hidden: "hidden",
  disabled: "disabled",
  checked: "checked",
  value: "value",
  htmlFor: "htmlFor",
  open: "open",
  tabIndex: "tabIndex",
  type: "type",
  required: "required",
  selected: "selected",
};

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** Replace an element's children. */
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

let counter = 0;
/** A fresh id for label/field pairs. */
export function uid(prefix = "id") {
  counter += 1;
  return `${prefix}-${counter}`;
}

/** A labelled field: [label, control] wired by id. */
export function field(labelText, control, { hint } = {}) {
  if (!control.id) control.id = uid("field");
  const label = h("label", { htmlFor: control.id }, labelText);
  const parts = [label, control];
  if (hint) {
    const note = h("span", { class: "hint", id: uid("hint") }, hint);
    control.setAttribute("aria-describedby", note.id);
    parts.push(note);
  }
  return h("div", { class: "field" }, parts);
}

/** A badge: a short visible word (status, flags). */
export function badge(text, tone = "") {
  return h("span", { class: `badge ${tone}`.trim() }, text);
}
