"""Schemathesis against the live server on loopback, from the document it serves: every operation
through the coverage phase (each constraint's boundaries, both sides) and the fuzzing phase, with
deterministic generation. Checked: no 5xx, status codes, content types, headers and bodies as
documented, schema-valid requests accepted (2xx), schema-invalid ones refused (4xx).

Measured on the 2-core dev machine (CPU build of torch, embedded SmolLM2): ~1,560 requests, about
1,450 from the coverage phase (632 chat, 460 completions, 282 tokenize, the rest a few dozen) and
up to MAX_EXAMPLES per operation from fuzzing; 40 s of wall time while the machine was otherwise
quiet, 128 s while other jobs kept both cores busy (load 7-8), ~75 s of CPU time either way.

Two hooks keep it bounded and meaningful without changing what is judged:
- `shape_positive_case` trims only schema-valid cases, and keeps them schema-valid: a generation
  request asks for at most MAX_TOKENS tokens and MAX_CHOICES choices, over a short prompt, so the
  model's work stays small; it names the served model, uses one structured-output spelling and
  JSON tool-call arguments, so most such cases reach the engine instead of a documented 400/404.
- `refusal_no_schema_can_state` lets a schema-valid request be refused only for what the document's
  400 lists as beyond any schema (a grammar the backend cannot compile, duplicate tool names...).
"""
from __future__ import annotations

import collections
import json
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import pytest
import schemathesis
from schemathesis.engine import events, from_schema
from schemathesis.generation import GenerationMode
from schemathesis.openapi.checks import RejectedPositiveData

MAX_EXAMPLES = 20          # fuzzing-phase cases per operation
SEED = 19
MAX_TOKENS = 2
MAX_CHOICES = 2
MAX_PROMPTS = 2
MAX_MESSAGES = 2
MAX_PARTS = 2              # content parts per message, tool calls per message, tools per request
MAX_TEXT = 16              # characters of each prompt text
MAX_SCHEMA_CHARS = 200     # of a tool's parameters, as JSON
MIN_HEALTH_TIMEOUT = 5.0   # seconds: a probe shorter than a decode step fails by design (503)

GENERATION_PATHS = {"/v1/chat/completions", "/v1/completions"}
MESSAGE_PATHS = {"/v1/chat/completions", "/tokenize"}
CONSTRAINT_FIELDS = ("response_format", "structured_outputs", "regex", "ebnf", "json_schema", "guided_json",
                     "guided_regex", "guided_choice", "guided_grammar")

# Refusals of schema-valid requests that the 400 documents as beyond a schema, by error code or
# by the message's start: whether a grammar compiles, how many tokens a text makes, duplicates
# and cross-references inside lists.
UNSTATABLE_CODES = {"invalid_grammar", "context_length_exceeded"}
# Whether an id names a stored response (GET/DELETE /v1/responses/{id}, previous_response_id).
UNSTATABLE_NOT_FOUND = {"response_not_found"}
UNSTATABLE_MESSAGES = ("tools: function names must be unique", "tool_choice: function ",
                       "messages: chat template failed")


# ---- hooks ---------------------------------------------------------------------------------
def _is_positive(case) -> bool:
    return case.meta is not None and case.meta.generation.mode == GenerationMode.POSITIVE


def _short(text: Any) -> Any:
    return text[:MAX_TEXT] if isinstance(text, str) and text else text


def _shorten_messages(body: dict) -> None:
    messages = body.get("messages")
    if not isinstance(messages, list):
        return
    del messages[MAX_MESSAGES:]
    for m in messages:
        if not isinstance(m, dict):
            continue
        content = m.get("content")
        if isinstance(content, list):
            del content[MAX_PARTS:]
            for part in content:
                if isinstance(part, dict):
                    part["text"] = _short(part.get("text"))
            m["content"] = [_short(p) if isinstance(p, str) else p for p in content]
        elif isinstance(content, str):
            m["content"] = _short(content)
        calls = m.get("tool_calls")
        if isinstance(calls, list):
            del calls[MAX_PARTS:]
            for call in calls:  # arguments are JSON text; the schema can only say "string"
                function = call.get("function") if isinstance(call, dict) else None
                if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                    try:
                        json.loads(function["arguments"])
                    except ValueError:
                        function["arguments"] = "{}"


def _bound_work(body: dict, served_model: str) -> None:
    for name in ("max_tokens", "max_completion_tokens"):
        if isinstance(body.get(name), (int, float)) and not isinstance(body[name], bool):
            body[name] = min(body[name], MAX_TOKENS)
    if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        body["max_tokens"] = MAX_TOKENS
    budget = body.get("max_completion_tokens") or body["max_tokens"]
    if isinstance(body.get("min_tokens"), (int, float)):
        body["min_tokens"] = min(body["min_tokens"], budget)
    if isinstance(body.get("n"), (int, float)):
        body["n"] = min(body["n"], MAX_CHOICES)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        body["prompt"] = _short(prompt)
    elif isinstance(prompt, list) and prompt and not isinstance(prompt[0], (int, float)):
        body["prompt"] = [_short(p) if isinstance(p, str) else p[:MAX_TEXT] for p in prompt[:MAX_PROMPTS]]
    elif isinstance(prompt, list):
        body["prompt"] = prompt[:MAX_TEXT]
    if isinstance(body.get("tools"), list):
        del body["tools"][MAX_PARTS:]
        for tool in body["tools"]:
            function = tool.get("function") if isinstance(tool, dict) else None
            if isinstance(function, dict):
                function["description"] = _short(function.get("description"))
                # Random parameter schemas render into thousands of prompt tokens and grammar states;
                # a small one takes the same path through the template, the grammar and the parser.
                if len(json.dumps(function.get("parameters", {}))) > MAX_SCHEMA_CHARS:
                    function["parameters"] = {"type": "object"}
    if body.get("model") is not None:
        body["model"] = served_model


def _bound_response(body: dict, served_model: str) -> None:
    """POST /v1/responses: the same bounds as chat, in Responses' field names."""
    if isinstance(body.get("max_output_tokens"), (int, float)) and not isinstance(body["max_output_tokens"], bool):
        body["max_output_tokens"] = min(body["max_output_tokens"], MAX_TOKENS)
    if body.get("max_output_tokens") is None:
        body["max_output_tokens"] = MAX_TOKENS
    # A random id names no stored response (a documented 404); without one the case reaches the model.
    body.pop("previous_response_id", None)
    items = body.get("input")
    if isinstance(items, str):
        body["input"] = _short(items)
    elif isinstance(items, list):
        del items[MAX_MESSAGES:]
        for item in items:
            if not isinstance(item, dict):
                continue
            for key in ("content", "output"):
                if isinstance(item.get(key), str):
                    item[key] = _short(item[key])
                elif isinstance(item.get(key), list):
                    del item[key][MAX_PARTS:]
                    for part in item[key]:
                        if isinstance(part, dict):
                            part["text"] = _short(part.get("text"))
            if isinstance(item.get("arguments"), str):  # JSON text; the schema can only say "string"
                try:
                    json.loads(item["arguments"])
                except ValueError:
                    item["arguments"] = "{}"
    if isinstance(body.get("tools"), list):
        del body["tools"][MAX_PARTS:]
        for tool in body["tools"]:
            if isinstance(tool, dict):
                tool["description"] = _short(tool.get("description"))
                if len(json.dumps(tool.get("parameters") or {})) > MAX_SCHEMA_CHARS:
                    tool["parameters"] = {"type": "object"}
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    if isinstance(fmt, dict) and body.get("tools") and body.get("tool_choice") != "none":
        text.pop("format")  # one constraint per request: tools count as one
    if isinstance(fmt, dict) and isinstance(fmt.get("schema"), dict) and len(json.dumps(fmt["schema"])) > MAX_SCHEMA_CHARS:
        fmt["schema"] = {"type": "object"}
    if body.get("model") is not None:
        body["model"] = served_model


def _one_constraint(body: dict) -> None:
    """Keep one structured-output spelling (tools other than tool_choice none count as one)."""
    def is_set(name: str) -> bool:
        value = body.get(name)
        return value is not None and not (name == "response_format" and value.get("type") == "text")

    tools_constrain = bool(body.get("tools")) and body.get("tool_choice") != "none"
    spellings = [name for name in CONSTRAINT_FIELDS if is_set(name)]
    for name in spellings[0 if tools_constrain else 1:]:
        del body[name]


def _probe_long_enough(case) -> None:
    """A health probe's timeout in (0, MIN_HEALTH_TIMEOUT) goes up to it: still valid, and an invalid
    one stays as it is, so this holds for negative cases too."""
    query = case.query if isinstance(case.query, dict) else {}
    try:
        timeout = float(query["timeout"])
    except (KeyError, TypeError, ValueError):
        return
    if 0 < timeout < MIN_HEALTH_TIMEOUT:
        query["timeout"] = MIN_HEALTH_TIMEOUT


def make_shape_positive_case(served_model: str):
    def shape_positive_case(context, case):
        path = context.operation.path
        if path == "/health/generate":
            _probe_long_enough(case)
        if not _is_positive(case):
            return case
        body = case.body
        if isinstance(body, dict):
            if path in MESSAGE_PATHS:
                _shorten_messages(body)
            if path in GENERATION_PATHS:
                _bound_work(body, served_model)
                _one_constraint(body)
            if path == "/v1/responses":
                _bound_response(body, served_model)
        return case

    return shape_positive_case


def refusal_no_schema_can_state(context, failure, case, response) -> bool:
    """False (drop the failure) for a schema-valid request refused for a documented reason no
    schema can state."""
    if not isinstance(failure, RejectedPositiveData) or response.status_code not in (400, 404):
        return True
    try:
        error = json.loads(response.content)["error"]
    except (ValueError, KeyError, TypeError):
        return True
    if response.status_code == 404:
        return error.get("code") not in UNSTATABLE_NOT_FOUND
    if error.get("code") in UNSTATABLE_CODES:
        return False
    return not str(error.get("message", "")).startswith(UNSTATABLE_MESSAGES)


# ---- the run -------------------------------------------------------------------------------
@dataclass
class FuzzReport:
    seconds: float = 0.0
    cases: collections.Counter = field(default_factory=collections.Counter)        # (phase, operation)
    statuses: collections.Counter = field(default_factory=collections.Counter)     # (operation, mode, status)
    failures: list[str] = field(default_factory=list)


def _describe(label: str, check: str, case, response) -> str:
    body = json.dumps(case.body, default=str)[:400] if case.body is not None else ""
    query = f"?{case.query}" if case.query else ""
    answer = f"{response.status_code} {response.content[:300]!r}" if response is not None else "no response"
    mode = case.meta.generation.mode.value if case.meta else "?"
    return f"{label}{query} [{check}, {mode}] {body} -> {answer}"


# Learning from responses is off: they carry random request ids and depend on timing, and the run
# is to be the same every time. Examples are off: the document has none.
_NOT_ADAPTIVE = {"extra-data-sources": {"responses": False}}
FUZZ_CONFIG = {
    "seed": SEED,
    "phases": {"examples": {"enabled": False}, "stateful": {"enabled": False},
               "coverage": {"enabled": True, **_NOT_ADAPTIVE},
               "fuzzing": {"enabled": True, "error-feedback": {"enabled": False}, **_NOT_ADAPTIVE}},
    "generation": {"max-examples": MAX_EXAMPLES, "deterministic": True, "database": "none"},
    # Schema-valid means accepted: 2xx only (the defaults also take 404 and 5xx).
    "checks": {"positive_data_acceptance": {"expected-statuses": ["2xx"]}},
    "request-timeout": 60,
}


def load_schema(url: str, served_model: str):
    schema = schemathesis.openapi.from_url(url + "/openapi.json", config=schemathesis.Config.from_dict(FUZZ_CONFIG))
    schema.hook("map_case")(make_shape_positive_case(served_model))
    schema.hook("filter_failure")(refusal_no_schema_can_state)
    return schema


def run_schemathesis(url: str, served_model: str) -> FuzzReport:
    schema = load_schema(url, served_model)
    report = FuzzReport()
    start = time.monotonic()
    for event in from_schema(schema).execute():
        if isinstance(event, events.ScenarioFinished):
            recorder = event.recorder
            report.cases[(event.phase.value, recorder.label)] += len(recorder.cases)
            for case_id, interaction in recorder.interactions.items():
                case = recorder.cases[case_id].value
                if interaction.response is not None and case.meta is not None:
                    report.statuses[(recorder.label, case.meta.generation.mode.value,
                                     interaction.response.status_code)] += 1
            for case_id, checks in recorder.checks.items():
                for check in checks:
                    if check.failure_info is not None:
                        interaction = recorder.interactions.get(case_id)
                        report.failures.append(_describe(recorder.label, check.name, recorder.cases[case_id].value,
                                                         interaction.response if interaction else None))
        elif isinstance(event, events.NonFatalError):
            report.failures.append(f"{event.label}: {event.info.title}: {event.info.message[:500]}")
        elif isinstance(event, events.FatalError):
            report.failures.append(f"fatal: {event.exception!r}")
    report.seconds = time.monotonic() - start
    return report


@pytest.fixture(scope="module")
def fuzz(api_server) -> FuzzReport:
    report = run_schemathesis(api_server.url, api_server.model)
    api_server.check_pages()
    return report


# ---- what the run must show ----------------------------------------------------------------
def test_schemathesis_finds_no_failures(fuzz):
    assert fuzz.failures == [], f"{len(fuzz.failures)} failures:\n" + "\n".join(fuzz.failures[:30])


def test_the_run_reaches_every_operation_in_both_phases(fuzz, api_server):
    import httpx

    document = httpx.get(api_server.url + "/openapi.json", timeout=30).json()
    operations = {f"{method.upper()} {path}" for path, ops in document["paths"].items() for method in ops}
    for phase in ("coverage", "fuzzing"):
        reached = {operation for (p, operation), n in fuzz.cases.items() if p == phase and n > 0}
        assert reached == operations, (phase, operations - reached)


def test_schema_valid_generation_requests_reach_the_model(fuzz):
    # Without this the hooks could make every case a cheap refusal and the run would prove little.
    for operation in ("POST /v1/chat/completions", "POST /v1/completions", "POST /v1/responses"):
        answered = sum(n for (op, mode, status), n in fuzz.statuses.items()
                       if op == operation and mode == "positive" and status == 200)
        assert answered >= MAX_EXAMPLES // 2, (operation, answered)

