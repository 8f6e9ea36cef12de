// The server's public API as the page calls it: JSON requests and server-sent event streams, each
// with the API key (kept in session storage only) when the server asks for one.

const KEY = "radixserve.apiKey";

export class ApiError extends Error {
  constructor(status, body) {
    const e = (body && body.error) || {};
    super(e.message || `HTTP ${status}`);
    this.status = status;
    this.param = e.param ?? null;
    this.code = e.code ?? null;
  }
}

export const apiKey = {
  get: () => sessionStorage.getItem(KEY) || "",
  set: (key) => (key ? sessionStorage.setItem(KEY, key) : sessionStorage.removeItem(KEY)),
};

// Called with the ApiError when the server refuses the key (401); the page asks for another.
let onUnauthorized = () => {};
export function whenUnauthorized(fn) { onUnauthorized = fn; }

function headers(json) {
  const h = {};
  if (json) h["Content-Type"] = "application/json";
  const key = apiKey.get();
  if (key) h["Authorization"] = `Bearer ${key}`;
  return h;
}

async function check(response) {
  if (response.ok) return response;
  let body = null;
  try { body = await response.json(); } catch { /* not JSON: the status says enough */ }
  const error = new ApiError(response.status, body);
  if (response.status === 401) onUnauthorized(error);
  throw error;
}

export async function getJSON(path, signal) {
  const response = await check(await fetch(path, { headers: headers(false), signal }));
  return response.json();
}

// POST `body` with stream: true and yield each event as {event, data} (data parsed from JSON),
// until `data: [DONE]` or the end of the body. Aborting `signal` closes the connection: the
// server sees the disconnect and frees the request.
export async function* postStream(path, body, signal) {
  const response = await check(await fetch(path, {
    method: "POST", headers: headers(true), body: JSON.stringify(body), signal,
  }));
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value.replace(/\r\n?/g, "\n");
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let event = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
        else if (line.startsWith("event:")) event = line.slice(6).trim();
      }
      if (!data.length) continue;   // a comment or a keep-alive ping
      const text = data.join("\n");
      if (text === "[DONE]") return;
      yield { event, data: JSON.parse(text) };
    }
  }
}
