// A feed that renders only what is visible (windowing), for timelines of any length.
//
// The items are plain values; `render(item, index)` makes the <article> of one. Only the
// items within `overscan` pixels of the viewport are in the DOM; two spacers stand for the
// rest. Heights are measured as items are drawn (an estimate stands for the others), and the
// item at the top of the view stays where it is when items above it turn out taller or
// shorter than estimated. A feed that is scrolled to its end follows new items (streaming).
//
// Accessibility (WAI-ARIA "feed" pattern): role=feed, each article with aria-posinset and
// aria-setsize (the whole count, not the drawn one), one article in the tab order at a time
// (roving tabindex); Page Down / Page Up (and the arrow keys) move between articles,
// Home / End go to the first / last.

import { h } from "./dom.js";

export class VirtualFeed {
  constructor({ label, render, estimate = 110, overscan = 900, onNearEnd = null, empty = "Nothing here yet." }) {
    this.render = render;
    this.estimate = estimate;
    this.overscan = overscan;
    this.onNearEnd = onNearEnd;
    this.items = [];
    this.heights = [];
    this.offsets = [0];
    this.dirty = false;
    this.nodes = new Map();
    this.active = 0;
    this.total = null; // aria-setsize when more exist than are loaded
    this.stick = false;
    this.pin = null; // an item to keep in view while heights are measured
    this.frame = 0;
    this.gap = null;
    this.measuredSum = 0;
    this.measuredCount = 0;

    this.top = h("div", { class: "spacer", "aria-hidden": "true" });
    this.bottom = h("div", { class: "spacer", "aria-hidden": "true" });
    this.feed = h("div", { class: "feed", role: "feed", "aria-label": label, "aria-busy": "false" }, this.top, this.bottom);
    this.placeholder = h("p", { class: "empty muted" }, empty);
    this.element = h("div", { class: "feed-scroller", tabIndex: -1 }, this.placeholder, this.feed);

    this.element.addEventListener("scroll", () => {
      this.stick = this.atEnd();
      this.schedule();
    }, { passive: true });
    // a <details> opened or an image loaded changes a height: measure again
    this.feed.addEventListener("toggle", () => this.schedule(), true);
    this.feed.addEventListener("load", () => this.schedule(), true);
    this.feed.addEventListener("focusin", (event) => {
      const index = this.indexOfNode(event.target);
      if (index !== null) this.setActive(index);
    });
    this.feed.addEventListener("keydown", (event) => this.onKey(event));
    new ResizeObserver(() => this.schedule()).observe(this.element);
  }

  // --- the items ------------------------------------------------------------------------

  /** Replace every item; `toEnd` shows the last ones (and follows new ones), `keepScroll`
   * stays about where the reader was. */
  setItems(items, { toEnd = false, keepScroll = false } = {}) {
    const scrolled = this.element.scrollTop;
    for (const node of this.nodes.values()) node.remove();
    this.nodes.clear();
    this.items = items.slice();
    this.heights = this.items.map(() => -1);
    this.dirty = true;
    this.active = toEnd ? Math.max(0, items.length - 1) : 0;
    this.stick = toEnd;
    this.element.scrollTop = keepScroll ? scrolled : 0;
    this.update();
    if (toEnd) this.scrollToEnd();
  }

  /** Add items at the end (a feed at its end keeps following). */
  append(items) {
    if (!items.length) return;
    for (const item of items) {
      this.items.push(item);
      this.heights.push(-1);
    }
    this.dirty = true;
    this.schedule();
  }

  /** Replace the item at `index` (a streaming message that grew). */
  replace(index, item) {
    this.items[index] = item;
    const node = this.nodes.get(index);
    if (node) {
      const fresh = this.make(index);
      const hadFocus = node.contains(document.activeElement);
      node.replaceWith(fresh);
      this.nodes.set(index, fresh);
      if (hadFocus) fresh.focus({ preventScroll: true });
    }
    this.schedule();
  }

  /** Keep the first `length` items, drop the rest. */
  truncate(length) {
    if (length >= this.items.length) return;
    for (const [index, node] of this.nodes) {
      if (index >= length) {
        this.release(node);
        this.nodes.delete(index);
      }
    }
    this.items.length = length;
    this.heights.length = length;
    this.active = Math.min(this.active, Math.max(0, length - 1));
    this.dirty = true;
    this.schedule();
  }

  /** The whole count, when more items exist than are loaded (aria-setsize). */
  setTotal(total) {
    this.total = total;
  }

  busy(flag) {
    this.feed.setAttribute("aria-busy", flag ? "true" : "false");
  }

  get length() {
    return this.items.length;
  }

  /** How many articles are in the DOM now. */
  get drawn() {
    return this.nodes.size;
  }

  // --- scrolling ------------------------------------------------------------------------

  atEnd() {
    const el = this.element;
    return el.scrollTop + el.clientHeight >= el.scrollHeight - 8;
  }

  scrollToEnd() {
    this.stick = true;
    this.update();
    this.element.scrollTop = this.element.scrollHeight;
    this.update();
  }

  /** Bring item `index` into view (its top or its bottom edge, whichever is nearer). */
  scrollToIndex(index) {
    this.ensureOffsets();
    const el = this.element;
    const top = this.offsets[index];
    const bottom = top + this.height(index);
    if (top < el.scrollTop) this.pin = { index, edge: "start" };
    else if (bottom > el.scrollTop + el.clientHeight) this.pin = { index, edge: "end" };
    else return;
    this.stick = false;
    this.update();
  }

  /** Where the view must start to show the pinned item (or the end), with what is known now. */
  pinnedTop() {
    const el = this.element;
    const view = el.clientHeight || 600;
    const total = this.offsets[this.items.length];
    const last = Math.max(0, total - view);
    if (this.stick) return last;
    if (!this.pin) return null;
    const { index, edge } = this.pin;
    const at = edge === "start" ? this.offsets[index] : this.offsets[index] + this.height(index) - view;
    return Math.max(0, Math.min(last, at));
  }

  schedule() {
    if (this.frame) return;
    this.frame = requestAnimationFrame(() => {
      this.frame = 0;
      this.update();
    });
  }

  update() {
    if (this.frame) {
      cancelAnimationFrame(this.frame);
      this.frame = 0;
    }
    this.placeholder.hidden = this.items.length > 0;
    for (let pass = 0; pass < 4; pass += 1) {
      if (!this.pass()) break;
    }
    const pinned = this.pinnedTop();
    if (pinned !== null) this.element.scrollTop = pinned;
    this.pin = null;
    if (this.onNearEnd && this.lastDrawn >= this.items.length - 10) this.onNearEnd();
  }

  // --- drawing --------------------------------------------------------------------------

  ensureOffsets() {
    if (!this.dirty && this.offsets.length === this.items.length + 1) return;
    const offsets = new Array(this.items.length + 1);
    offsets[0] = 0;
    for (let i = 0; i < this.items.length; i += 1) offsets[i + 1] = offsets[i] + this.height(i);
    this.offsets = offsets;
    this.dirty = false;
  }

  /** The index of the item at height y (the last one whose top is at or above it). */
  indexAt(y) {
    const offsets = this.offsets;
    let low = 0;
    let high = this.items.length - 1;
    while (low < high) {
      const mid = (low + high + 1) >> 1;
      if (offsets[mid] <= y) low = mid;
      else high = mid - 1;
    }
    return Math.max(0, low);
  }

  /** Draw the items around the viewport and measure them; whether a height changed. */
  pass() {
    const n = this.items.length;
    this.ensureOffsets();
    const el = this.element;
    const view = el.clientHeight || 600;
    const top = this.pinnedTop() ?? el.scrollTop;
    const start = n ? this.indexAt(Math.max(0, top - this.overscan)) : 0;
    const end = n ? Math.min(n, this.indexAt(top + view + this.overscan) + 1) : 0;

    for (const [index, node] of this.nodes) {
      if (index < start || index >= end) {
        this.release(node);
        this.nodes.delete(index);
      }
    }
    let next = this.bottom;
    for (let i = end - 1; i >= start; i -= 1) {
      let node = this.nodes.get(i);
      if (!node) {
        node = this.make(i);
        this.nodes.set(i, node);
      }
      if (node.nextSibling !== next || node.parentNode !== this.feed) this.feed.insertBefore(node, next);
      next = node;
    }
    this.lastDrawn = end - 1;
    this.setSpacers(start, end);

    // measure what is drawn; keep the first visible item where it is on the screen
    if (this.gap === null && this.nodes.size) {
      this.gap = parseFloat(getComputedStyle(this.nodes.values().next().value).marginBottom) || 0;
    }
    let anchor = start;
    while (anchor < end - 1 && this.offsets[anchor] + this.height(anchor) <= top) anchor += 1;
    const anchorGap = this.offsets[anchor] - top;
    let changed = false;
    for (let i = start; i < end; i += 1) {
      const height = this.nodes.get(i).offsetHeight + (this.gap || 0);
      if (Math.abs(height - this.heights[i]) > 0.5) {
        if (this.heights[i] < 0) {
          this.measuredCount += 1;
          this.measuredSum += height;
        } else {
          this.measuredSum += height - this.heights[i];
        }
        this.heights[i] = height;
        changed = true;
      }
    }
    // the items not drawn yet are estimated from those drawn so far
    const mean = this.measuredCount ? this.measuredSum / this.measuredCount : this.estimate;
    if (Math.abs(mean - this.estimate) > 4) {
      this.estimate = mean;
      changed = true;
    }
    if (changed) {
      this.dirty = true;
      this.ensureOffsets();
      this.setSpacers(start, end);
      const pinned = this.pinnedTop();
      el.scrollTop = pinned !== null ? pinned : Math.max(0, this.offsets[anchor] - anchorGap);
    }
    return changed;
  }

  /** An item's height: measured, or the estimate until it is drawn. */
  height(index) {
    const measured = this.heights[index];
    return measured >= 0 ? measured : this.estimate;
  }

  setSpacers(start, end) {
    const n = this.items.length;
    this.top.style.height = `${this.offsets[start]}px`;
    this.bottom.style.height = `${this.offsets[n] - this.offsets[end]}px`;
  }

  make(index) {
    const node = this.render(this.items[index], index);
    node.dataset.index = String(index);
    node.setAttribute("aria-posinset", String(index + 1));
    node.setAttribute("aria-setsize", String(Math.max(this.total ?? 0, this.items.length)));
    node.tabIndex = index === this.active ? 0 : -1;
    return node;
  }

  release(node) {
    if (node.contains(document.activeElement)) this.element.focus({ preventScroll: true });
    node.remove();
  }

  // --- keyboard -------------------------------------------------------------------------

  indexOfNode(target) {
    const article = target.closest?.(".feed > [data-index]");
    return article && article.parentNode === this.feed ? Number(article.dataset.index) : null;
  }

  setActive(index) {
    if (index === this.active) return;
    const before = this.nodes.get(this.active);
    if (before) before.tabIndex = -1;
    this.active = index;
    const now = this.nodes.get(index);
    if (now) now.tabIndex = 0;
  }

  focusIndex(index) {
    if (!this.items.length) return;
    const target = Math.max(0, Math.min(this.items.length - 1, index));
    this.setActive(target);
    this.scrollToIndex(target);
    this.nodes.get(target)?.focus({ preventScroll: true });
  }

  onKey(event) {
    const index = this.indexOfNode(event.target);
    if (index === null || event.target !== this.nodes.get(index)) return; // keys inside an article are its own
    const moves = {
      PageDown: index + 1,
      ArrowDown: index + 1,
      PageUp: index - 1,
      ArrowUp: index - 1,
      Home: 0,
      End: this.items.length - 1,
    };
    if (!(event.key in moves)) return;
    event.preventDefault();
    this.focusIndex(moves[event.key]);
  }
}
