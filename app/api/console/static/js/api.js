// The console's only way to the server: the native HTTP API (docs/contract.md), with the API
// key the user gave, kept for this browser session only (sessionStorage).

const KEY_ITEM = "carryover.console.apiKey";

/** Where the API is: the page is served at <base>/console. */
export const BASE = location.pathname.replace(/\/console\/?$/, "");

/** A refusal of the API: its status and RFC 9457 problem (type, title, detail, …). */
export class ApiProblem extends Error {
  constructor(status, problem) {
    const body = problem && typeof problem === "object" ? problem : {};
    super(body.detail || body.title || `HTTP ${status}`);
    this.status = status;
    this.problem = body;
    this.slug = String(body.type || "").split("/problems/")[1] || "";
    this.title = body.title || `HTTP ${status}`;
  }
}

/** The connection failed (server gone, network down): not an answer. */
export class Unreachable extends Error {}

export function storedKey() {
  try {
    return sessionStorage.getItem(KEY_ITEM) || "";
  } catch {
    return "";
  }
}

export function storeKey(key) {
  sessionStorage.setItem(KEY_ITEM, key);
}

export function forgetKey() {
  sessionStorage.removeItem(KEY_ITEM);
}

/** Path segments quoted: conversation ids may hold ":" and ".", never "/". */
export function path(...parts) {
  return parts.map((p) => encodeURIComponent(p)).join("/");
}

export function conversationPath(id, ...rest) {
  return `/conversations/${path(id, ...rest)}`;
}

function headers(extra = {}) {
  const all = { ...extra };
  const key = storedKey();
  if (key) all.Authorization = `Bearer ${key}`;
  return all;
}

/** Called with every 401, so the page can ask for a key again. */
let onUnauthorized = () => {};
export function whenUnauthorized(handler) {
  onUnauthorized = handler;
}

async function problemOf(response) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    body = null;
  }
  return new ApiProblem(response.status, body);
}

/**
 * One request. `json`: a body sent as JSON (or `contentType` for another JSON media type).
 * Answers the Response when its status is 2xx or 304; throws ApiProblem otherwise.
 */
export async function request(method, url, opts = {}) {
  const init = { method, headers: headers(opts.headers), signal: opts.signal, cache: "no-store" };
  if (opts.json !== undefined) {
    init.body = JSON.stringify(opts.json);
    init.headers["Content-Type"] = opts.contentType || "application/json";
  }
  let response;
  try {
    response = await fetch(BASE + url, init);
  } catch (error) {
    if (error.name === "AbortError") throw error;
    throw new Unreachable(`the server could not be reached (${error.message})`);
  }
  if (response.ok || response.status === 304) return response;
  const problem = await problemOf(response);
  if (response.status === 401) onUnauthorized(problem);
  throw problem;
}

/** A request whose answer is JSON: {body, response} (body null for 204 and 304). */
export async function json(method, url, opts = {}) {
  const response = await request(method, url, opts);
  if (response.status === 204 || response.status === 304) return { body: null, response };
  return { body: await response.json(), response };
}

export const get = (url, opts) => json("GET", url, opts);
export const post = (url, body, opts = {}) => json("POST", url, { ...opts, json: body ?? {} });

/** A URL with query parameters (undefined, null and "" left out; arrays repeated). */
export function query(url, params) {
  const search = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value === undefined || value === null || value === "") continue;
    for (const one of Array.isArray(value) ? value : [value]) search.append(name, String(one));
  }
  const text = search.toString();
  return text ? `${url}?${text}` : url;
}

/**
 * Server-sent events of a request (fetch, so the key can be sent: EventSource cannot send an
 * Authorization header). Yields {event, data (parsed JSON), id}; ends with the stream.
 * `opts.lastEventId` resumes after that event.
 */
export async function* events(method, url, opts = {}) {
  const extra = { Accept: "text/event-stream", ...(opts.headers || {}) };
  if (opts.lastEventId) extra["Last-Event-ID"] = String(opts.lastEventId);
  const response = await request(method, url, { ...opts, headers: extra });
  const type = response.headers.get("content-type") || "";
  if (!type.startsWith("text/event-stream")) {
    // answered as JSON (e.g. a background run's 202): one event with the record
    const body = await response.json();
    yield { event: "record", data: body, id: null };
    return;
  }
  yield* parseEvents(response.body);
}

/** The event-stream format (HTML Living Standard, "Server-sent events") over a byte stream. */
export async function* parseEvents(stream) {
  const reader = stream.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let event = "message";
  let data = [];
  let id = null;
  let ended = false;
  try {
    while (true) {
      const { value, done } = await reader.read();
      if (done) {
        ended = true;
        break;
      }
      buffer += value;
      let newline;
      while ((newline = buffer.search(/\r\n|\r|\n/)) >= 0) {
        const line = buffer.slice(0, newline);
        const skip = buffer[newline] === "\r" && buffer[newline + 1] === "\n" ? 2 : 1;
        if (buffer[newline] === "\r" && newline + 1 === buffer.length) break; // maybe \r\n
        buffer = buffer.slice(newline + skip);
        if (line === "") {
          if (data.length) {
            const text = data.join("\n");
            let parsed;
            try {
              parsed = JSON.parse(text);
            } catch {
              parsed = text;
            }
            yield { event, data: parsed, id };
          }
          event = "message";
          data = [];
          continue;
        }
        if (line.startsWith(":")) continue; // a comment (keep-alive)
        const colon = line.indexOf(":");
        const name = colon < 0 ? line : line.slice(0, colon);
        let value = colon < 0 ? "" : line.slice(colon + 1);
        if (value.startsWith(" ")) value = value.slice(1);
        if (name === "event") event = value;
        else if (name === "data") data.push(value);
        else if (name === "id") id = value;
      }
    }
  } finally {
    // the reader stopped early (the page moved on): close the connection
    if (!ended) reader.cancel().catch(() => {});
  }
}

/** Save an answer's body as a file (the export). */
export async function download(url, filename) {
  const response = await request("GET", url);
  const blob = await response.blob();
  const link = document.createElement("a");
  link.href = URL.createObjectURL(blob);
  link.download = filename;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 10_000);
}
