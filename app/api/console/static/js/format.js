// How values read on the page: times, durations, token counts, short ids.

const timeFormat = new Intl.DateTimeFormat(undefined, {
  dateStyle: "medium",
  timeStyle: "medium",
});
const shortTime = new Intl.DateTimeFormat(undefined, {
  month: "short",
  day: "numeric",
  hour: "2-digit",
  minute: "2-digit",
});
const numbers = new Intl.NumberFormat();

export function when(iso) {
  if (!iso) return "—";
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? iso : timeFormat.format(date);
}

export function shortWhen(iso) {
  if (!iso) return "—";
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? iso : shortTime.format(date);
}

/** A <time> element: the short form shown, the full one in its title. */
export function timeElement(iso, short = true) {
  const el = document.createElement("time");
  if (iso) el.dateTime = iso;
  el.textContent = short ? shortWhen(iso) : when(iso);
  el.title = when(iso);
  return el;
}

export function count(n) {
  return numbers.format(n ?? 0);
}

export function plural(n, one, many = `${one}s`) {
  return `${count(n)} ${n === 1 ? one : many}`;
}

export function duration(ms) {
  if (ms === null || ms === undefined) return "—";
  if (ms < 1000) return `${ms} ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(ms < 10_000 ? 2 : 1)} s`;
  const minutes = Math.floor(ms / 60_000);
  return `${minutes} min ${Math.round((ms % 60_000) / 1000)} s`;
}

export function usage(u) {
  if (!u) return "—";
  const parts = [`${count(u.input_tokens)} in`, `${count(u.output_tokens)} out`];
  if (u.cache_read_tokens) parts.push(`${count(u.cache_read_tokens)} cache read`);
  if (u.cache_write_tokens) parts.push(`${count(u.cache_write_tokens)} cache write`);
  return `${parts.join(" · ")} tokens`;
}

export function shortId(id) {
  return id && id.length > 13 ? `${id.slice(0, 8)}…` : id || "";
}

export function shorten(text, max = 120) {
  const flat = String(text ?? "").replace(/\s+/g, " ").trim();
  return flat.length > max ? `${flat.slice(0, max - 1)}…` : flat;
}

