// One assistant turn: streams from /v1/chat/completions or /v1/responses, shown as it arrives, with
// its tool calls, its JSON checked against the schema, and TTFT, tokens/s and cached tokens.
import { ApiError, postStream } from "./api.js";
import { Validator } from "./vendor/json-schema/index.js";

// Both APIs' streams as one sequence of events:
// {kind: "text", text} | {kind: "tool", index, id?, name?, args} | {kind: "usage", prompt, cached, completion}
// | {kind: "finish", reason} | {kind: "id", id} | {kind: "error", message}
async function* chatEvents(stream) {
  for await (const { data } of stream) {
    if (data.error) { yield { kind: "error", message: data.error.message }; continue; }
    for (const choice of data.choices || []) {
      const d = choice.delta || {};
      if (d.content) yield { kind: "text", text: d.content };
      for (const t of d.tool_calls || []) {
        yield { kind: "tool", index: t.index, id: t.id, name: t.function?.name, args: t.function?.arguments || "" };
      }
      if (choice.finish_reason) yield { kind: "finish", reason: choice.finish_reason };
    }
    const u = data.usage;
    if (u) yield { kind: "usage", prompt: u.prompt_tokens, cached: u.prompt_tokens_details?.cached_tokens ?? 0, completion: u.completion_tokens };
  }
}

async function* responsesEvents(stream) {
  const calls = new Map();   // output_index -> the call's index in this turn
  for await (const { data } of stream) {
    switch (data.type) {
      case "response.created":
        yield { kind: "id", id: data.response.id };
        break;
      case "response.output_text.delta":
        yield { kind: "text", text: data.delta };
        break;
      case "response.output_item.added":
        if (data.item.type === "function_call") {
          calls.set(data.output_index, calls.size);
          yield { kind: "tool", index: calls.get(data.output_index), id: data.item.call_id, name: data.item.name, args: "" };
        }
        break;
      case "response.function_call_arguments.delta":
        yield { kind: "tool", index: calls.get(data.output_index), args: data.delta };
        break;
      case "response.completed":
      case "response.incomplete": {
        const r = data.response, u = r.usage;
        if (u) yield { kind: "usage", prompt: u.input_tokens, cached: u.input_tokens_details?.cached_tokens ?? 0, completion: u.output_tokens };
        yield { kind: "id", id: r.id, done: true };
        yield { kind: "finish", reason: r.status === "completed" ? (calls.size ? "tool_calls" : "stop") : (r.incomplete_details?.reason || r.status) };
        break;
      }
      case "response.failed":
        yield { kind: "error", message: data.response?.error?.message || "the response failed" };
        break;
      case "error":
        yield { kind: "error", message: data.message || data.error?.message || "error" };
        break;
    }
  }
}

function el(tag, className, text) {
  const e = document.createElement(tag);
  if (className) e.className = className;
  if (text !== undefined) e.textContent = text;
  return e;
}

export class Turn {
  // `schema`: the JSON schema the reply must follow, or null.
  constructor(container, schema) {
    this.schema = schema;
    this.text = "";
    this.calls = [];          // {id, name, args, node}
    this.usage = null;
    this.finish = null;
    this.responseId = null;
    this.node = el("article", "msg assistant");
    this.node.dataset.state = "waiting";
    this.content = el("div", "content");
    this.callsNode = el("div", "tool-calls");
    this.stats = el("footer", "stats");
    this.node.append(this.content, this.callsNode, this.stats);
    container.append(this.node);
    this.node.scrollIntoView({ block: "end" });
  }

  // Stream one request; resolves once it ends (finished, stopped, or failed).
  async run(api, body, signal) {
    this.t0 = performance.now();
    this.node.dataset.sentAt = String(performance.timeOrigin + this.t0);
    const path = api === "responses" ? "/v1/responses" : "/v1/chat/completions";
    const events = api === "responses" ? responsesEvents : chatEvents;
    this.node.dataset.state = "streaming";
    try {
      for await (const e of events(postStream(path, body, signal))) this.on(e);
      this.end(this.finish ? "done" : "error", this.finish ? null : "the stream ended without a finish reason");
    } catch (e) {
      if (e.name === "AbortError") this.end("stopped", null);
      else this.end("error", e instanceof ApiError && e.param ? `${e.param}: ${e.message}` : e.message);
    }
  }

  on(e) {
    switch (e.kind) {
      case "text":
        this.first();
        this.text += e.text;
        this.content.append(e.text);
        break;
      case "tool": {
        this.first();
        let call = this.calls[e.index];
        if (!call) {
          call = this.calls[e.index] = { id: e.id, name: e.name || "", args: "", node: el("div", "tool-call") };
          call.node.append(el("span", "name", call.name), el("pre", "args"));
          this.callsNode.append(call.node);
        }
        call.args += e.args;
        call.node.querySelector(".args").append(e.args);
        break;
      }
      case "usage": this.usage = e; break;
      case "finish": this.finish = e.reason; break;
      case "id": this.responseId = e.id; break;
      case "error": throw new Error(e.message);
    }
  }

  first() {
    if (this.tFirst !== undefined) return;
    this.tFirst = performance.now();
    this.node.dataset.firstTokenAt = String(performance.timeOrigin + this.tFirst);
  }

  end(state, error) {
    const tEnd = performance.now();
    this.node.dataset.state = state;
    this.node.dataset.finish = this.finish || (state === "stopped" ? "stopped" : "");
    if (error) this.node.append(el("div", "error", error));
    if (this.schema && state === "done" && !this.calls.length) this.checkJson();
    const parts = [];
    if (this.tFirst !== undefined) {
      const ttft = this.tFirst - this.t0;
      this.node.dataset.ttftMs = ttft.toFixed(1);
      parts.push(el("span", "ttft", `TTFT ${ttft.toFixed(0)} ms`));
      const n = this.usage?.completion;
      if (n > 1 && tEnd > this.tFirst) parts.push(el("span", "tps", `${((n - 1) / ((tEnd - this.tFirst) / 1000)).toFixed(1)} tok/s`));
    }
    if (this.usage) {
      parts.push(el("span", "cached", `${this.usage.cached} of ${this.usage.prompt} prompt tokens cached`));
      this.node.dataset.cachedTokens = this.usage.cached;
    }
    if (state === "stopped") parts.push(el("span", "finish", "stopped"));
    else if (this.finish && this.finish !== "stop") parts.push(el("span", "finish", `finish: ${this.finish}`));
    this.stats.replaceChildren(...parts);
  }

  // Pretty-print the reply and say whether it validates against the schema (a real validator).
  checkJson() {
    const badge = el("div", "validity");
    let value;
    try {
      value = JSON.parse(this.text);
    } catch (e) {
      badge.dataset.valid = "false";
      badge.textContent = `not JSON: ${e.message}`;
      this.node.append(badge);
      return;
    }
    const pre = el("pre", "json", JSON.stringify(value, null, 2));
    this.content.replaceWith(pre);
    this.content = pre;
    const result = new Validator(this.schema, "2020-12", false).validate(value);
    badge.dataset.valid = String(result.valid);
    badge.textContent = result.valid ? "✓ valid against the schema"
      : `✗ invalid: ${result.errors.map((e) => `${e.instanceLocation} ${e.error}`).slice(0, 3).join("; ")}`;
    this.node.insertBefore(badge, this.stats);
  }

  // The assistant message as chat history; calls cut short (max tokens, stop) have no valid
  // arguments and are left out.
  asChatMessage() {
    const m = { role: "assistant", content: this.text || null };
    if (this.finish === "tool_calls") {
      m.tool_calls = this.calls.map((c) => ({ id: c.id, type: "function", function: { name: c.name, arguments: c.args } }));
    }
    return m;
  }
}
