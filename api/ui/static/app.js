// The page: settings, the conversation, and the cache view beside it.
import { ApiError, apiKey, getJSON, whenUnauthorized } from "./api.js";
import { CacheView } from "./cache_view.js";
import { Turn } from "./chat.js";
import { SCHEMAS, TOOLS } from "./examples.js";

const $ = (id) => document.getElementById(id);

const convo = {
  messages: [],                // chat history, without the system prompt
  previousResponseId: null,    // the Responses API's thread
  controller: null,            // aborts the running turn
  pendingCalls: null,          // tool calls waiting for their results
};

const cache = new CacheView();

// ---- settings -------------------------------------------------------------------------------
function parseJson(id) {
  try {
    return JSON.parse($(id).value);
  } catch (e) {
    throw new Error(`${$(id).dataset.label}: ${e.message}`);
  }
}

function number(id, parse = Number) {
  const v = $(id).value.trim();
  return v === "" ? undefined : parse(v);
}

function toolChoice() {
  const v = $("tool-choice").value;
  return v.startsWith("function:") ? { type: "function", name: v.slice(9) } : v;
}

// The request body for the API picked, beyond the input or messages.
function settings() {
  const s = {
    model: $("model").value,
    temperature: number("temperature"),
    top_p: number("top-p"),
    seed: number("seed", (v) => parseInt(v, 10)),
    system: $("system").value.trim(),
    mode: $("mode").value,
  };
  if (s.mode === "json_schema") s.schema = parseJson("schema");
  if (s.mode === "tools") s.tools = parseJson("tools");
  return s;
}

function chatBody(s) {
  const messages = s.system ? [{ role: "system", content: s.system }, ...convo.messages] : [...convo.messages];
  const body = {
    model: s.model, messages, stream: true, stream_options: { include_usage: true },
    temperature: s.temperature, top_p: s.top_p, seed: s.seed, max_tokens: number("max-tokens"),
  };
  if (s.schema) body.response_format = { type: "json_schema", json_schema: { name: $("schema-example").value || "reply", strict: true, schema: s.schema } };
  if (s.tools) {
    body.tools = s.tools;
    const choice = toolChoice();
    body.tool_choice = typeof choice === "string" ? choice : { type: "function", function: { name: choice.name } };
  }
  return body;
}

function responsesBody(s, input) {
  const body = {
    model: s.model, input, stream: true, temperature: s.temperature, top_p: s.top_p, seed: s.seed,
    max_output_tokens: number("max-tokens"), previous_response_id: convo.previousResponseId ?? undefined,
  };
  if (s.system) body.instructions = s.system;
  if (s.schema) body.text = { format: { type: "json_schema", name: $("schema-example").value || "reply", strict: true, schema: s.schema } };
  if (s.tools) {
    body.tools = s.tools.map((t) => ({ type: "function", ...(t.function || t) }));
    body.tool_choice = toolChoice();
  }
  return body;
}

// ---- the conversation -----------------------------------------------------------------------
function addUser(text) {
  const node = document.createElement("article");
  node.className = "msg user";
  node.textContent = text;
  $("messages").append(node);
}

function busy(on) {
  $("send").disabled = on;
  $("stop").disabled = !on;
  document.body.dataset.busy = on ? "true" : "false";
}

async function runTurn(input) {
  let s;
  try {
    s = settings();
  } catch (e) {
    showNotice(e.message);
    return;
  }
  const api = $("api").value;
  const turn = new Turn($("messages"), s.schema || null);
  convo.controller = new AbortController();
  busy(true);
  await turn.run(api, api === "responses" ? responsesBody(s, input) : chatBody(s), convo.controller.signal);
  convo.controller = null;
  busy(false);
  if (api === "responses" && turn.node.dataset.state === "done") convo.previousResponseId = turn.responseId;
  if (api === "chat" && turn.node.dataset.state !== "error") convo.messages.push(turn.asChatMessage());
  if (turn.node.dataset.state === "done" && turn.finish === "tool_calls") askToolResults(turn);
}

async function send() {
  const text = $("prompt").value.trim();
  if (!text || convo.controller) return;
  if (convo.pendingCalls) { showNotice("answer the tool calls first, or start a new conversation"); return; }
  $("prompt").value = "";
  addUser(text);
  const api = $("api").value;
  if (api === "chat") convo.messages.push({ role: "user", content: text });
  await runTurn(api === "responses" ? text : null);
}

// After a turn that called tools: one field per call for its result, then the turn goes on.
function askToolResults(turn) {
  const form = document.createElement("form");
  form.className = "tool-results";
  for (const call of turn.calls) {
    const label = document.createElement("label");
    label.textContent = `Result of ${call.name}(${call.args})`;
    const input = document.createElement("input");
    input.className = "tool-result";
    input.dataset.callId = call.id;
    input.required = true;
    label.append(input);
    form.append(label);
  }
  const submit = document.createElement("button");
  submit.textContent = "Send tool results";
  form.append(submit);
  turn.node.append(form);
  convo.pendingCalls = turn.calls;
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const results = [...form.querySelectorAll(".tool-result")].map((i) => ({ id: i.dataset.callId, output: i.value }));
    form.remove();
    convo.pendingCalls = null;
    for (const r of results) addUser(`tool result: ${r.output}`);
    if ($("api").value === "chat") {
      for (const r of results) convo.messages.push({ role: "tool", tool_call_id: r.id, content: r.output });
      await runTurn(null);
    } else {
      await runTurn(results.map((r) => ({ type: "function_call_output", call_id: r.id, output: r.output })));
    }
  });
  form.querySelector("input").focus();
}

function newConversation() {
  convo.controller?.abort();
  convo.messages = [];
  convo.previousResponseId = null;
  convo.pendingCalls = null;
  $("messages").replaceChildren();
}

function showNotice(text) {
  $("notice").textContent = text;
  $("notice").hidden = !text;
}

// ---- settings panel -------------------------------------------------------------------------
function showMode() {
  const mode = $("mode").value;
  $("schema-box").hidden = mode !== "json_schema";
  $("tools-box").hidden = mode !== "tools";
}

function fillToolChoices() {
  const keep = $("tool-choice").value;
  const options = ["auto", "required", "none"];
  try {
    for (const t of JSON.parse($("tools").value)) options.push(`function:${(t.function || t).name}`);
  } catch { /* shown when sent */ }
  $("tool-choice").replaceChildren(...options.map((o) => new Option(o.replace("function:", "function "), o)));
  if (options.includes(keep)) $("tool-choice").value = keep;
}

async function loadModels() {
  try {
    const models = await getJSON("/v1/models");
    $("model").replaceChildren(...models.data.map((m) => new Option(m.id, m.id)));
    $("server-status").textContent = "ready";
    showNotice("");
    cache.start();
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) return;   // the key dialog is open
    $("server-status").textContent = e instanceof ApiError && e.status === 503 ? "loading the model…" : "unreachable";
    setTimeout(loadModels, 1000);
  }
}

function askKey(error) {
  apiKey.set("");   // refused or forgotten: never sent again
  showNotice(error.message);
  const dialog = $("key-dialog");
  if (!dialog.open) dialog.showModal();
}

function init() {
  $("schema-example").replaceChildren(...Object.keys(SCHEMAS).map((k) => new Option(k, k)));
  $("schema").value = JSON.stringify(SCHEMAS.person, null, 2);
  $("schema-example").addEventListener("change", () => {
    $("schema").value = JSON.stringify(SCHEMAS[$("schema-example").value], null, 2);
  });
  $("tools").value = JSON.stringify(TOOLS, null, 2);
  $("tools").addEventListener("input", fillToolChoices);
  fillToolChoices();
  $("mode").addEventListener("change", showMode);
  showMode();
  $("api").addEventListener("change", newConversation);
  $("new-chat").addEventListener("click", newConversation);
  $("composer").addEventListener("submit", (ev) => { ev.preventDefault(); send(); });
  $("prompt").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); send(); }
  });
  $("stop").addEventListener("click", () => convo.controller?.abort());
  $("key-form").addEventListener("submit", () => {   // method=dialog: the dialog closes itself
    apiKey.set($("api-key").value.trim());
    $("api-key").value = "";
    loadModels();
  });
  $("forget-key").addEventListener("click", () => { apiKey.set(""); askKey(new Error("API key forgotten")); });
  whenUnauthorized(askKey);
  busy(false);
  start();
}

// Ask for the key first where one is needed and none is kept: no call fails on the way.
async function start() {
  let config = { api_key_required: false };
  try { config = await getJSON("/ui/config.json"); } catch { /* loadModels says what is wrong */ }
  if (config.api_key_required && !apiKey.get()) askKey(new Error("This server needs an API key."));
  else loadModels();
}

init();
