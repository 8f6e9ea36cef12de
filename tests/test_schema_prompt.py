"""A chat `response_format` json_schema is enforced and also stated at the end of the system
message, so a small model knows the shape it is held to; `--no-schema-in-prompt` only enforces."""
from __future__ import annotations

import json

import httpx

from radixserve.api.openai.chat_prompt import render_chat_prompt, states_schema, with_schema_instruction
from radixserve.api.openai.protocol import ChatMessage
from radixserve.api.server import build_app

from .api_server import serve_app

SCHEMA = {"type": "object", "properties": {"value": {"type": "number"}, "unit": {"type": "string"}},
          "required": ["value", "unit"], "additionalProperties": False}
COMPACT = json.dumps(SCHEMA, separators=(",", ":"))
USER = {"role": "user", "content": "Measure the tea's temperature."}


def test_the_schema_goes_at_the_end_of_an_existing_system_message():
    messages = [ChatMessage(role="system", content="Be brief."), ChatMessage(**USER)]
    stated = with_schema_instruction(messages, SCHEMA)
    assert stated[0].role == "system" and stated[0].content.startswith("Be brief.\n\n")
    assert stated[0].content.endswith(COMPACT)
    assert stated[1:] == messages[1:]
    assert messages[0].content == "Be brief."  # the request's own messages are left alone


def test_a_system_message_stating_the_schema_is_added_when_there_is_none():
    stated = with_schema_instruction([ChatMessage(**USER)], SCHEMA)
    assert [m.role for m in stated] == ["system", "user"]
    assert stated[0].content.endswith(COMPACT)


def prompt_tokens(url: str, model: str) -> int:
    r = httpx.post(url + "/v1/chat/completions", timeout=120, json={
        "model": model, "messages": [USER], "max_tokens": 4,
        "response_format": {"type": "json_schema", "json_schema": {"name": "m", "schema": SCHEMA}}})
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens"]


def test_a_served_json_schema_request_is_prompted_with_its_schema(api, default_tokenizer):
    expected = render_chat_prompt(default_tokenizer, with_schema_instruction([ChatMessage(**USER)], SCHEMA))
    assert prompt_tokens(api.url, api.model) == len(default_tokenizer.encode(expected))


def test_no_schema_in_prompt_leaves_the_messages_as_sent(api, default_tokenizer):
    with serve_app(build_app(api.engine, served_model_name=api.model, schema_in_prompt=False)) as url:
        served = prompt_tokens(url, api.model)
    assert served == len(default_tokenizer.encode(render_chat_prompt(default_tokenizer, [ChatMessage(**USER)])))


# ---- the note never costs the client: left out where a message holds the schema or it would not fit --
def test_a_schema_already_in_a_message_is_found_in_any_spacing():
    pretty = json.dumps(SCHEMA, indent=2)
    assert states_schema([ChatMessage(role="user", content=f"Reply as JSON matching:\n{pretty}\nThanks.")], SCHEMA)
    wrapped = json.dumps({"name": "m", "schema": SCHEMA})
    assert states_schema([ChatMessage(role="system", content=f"Format: {wrapped}")], SCHEMA)


def test_other_json_in_the_messages_is_not_taken_for_the_schema():
    other = dict(SCHEMA, required=["value"])
    text = f"Example {{ not json }} and {json.dumps(other)} and a stray brace {{"
    assert not states_schema([ChatMessage(role="user", content=text)], SCHEMA)


def served_prompt_tokens(url: str, model: str, messages: list[dict], **extra) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", timeout=120, json={
        "model": model, "messages": messages, "max_tokens": 2,
        "response_format": {"type": "json_schema", "json_schema": {"name": "m", "schema": SCHEMA}}, **extra})


def test_a_request_holding_its_schema_is_not_told_it_twice(api, default_tokenizer):
    messages = [{"role": "user", "content": f"Measure the tea. Schema: {json.dumps(SCHEMA, indent=1)}"}]
    r = served_prompt_tokens(api.url, api.model, messages)
    as_sent = render_chat_prompt(default_tokenizer, [ChatMessage(**m) for m in messages])
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == len(default_tokenizer.encode(as_sent))


def test_the_note_is_left_out_when_the_request_fits_only_without_it(api, default_tokenizer):
    context = api.engine.model_config.max_context_len
    base = render_chat_prompt(default_tokenizer, [ChatMessage(**USER)])
    with_note = render_chat_prompt(default_tokenizer, with_schema_instruction([ChatMessage(**USER)], SCHEMA))
    plain_len, note_len = len(default_tokenizer.encode(base)), len(default_tokenizer.encode(with_note))
    max_tokens = context - plain_len   # exactly fits the messages as sent; the note would overflow
    assert note_len > plain_len
    r = served_prompt_tokens(api.url, api.model, [USER], max_tokens=max_tokens, temperature=0, stop=["}"])
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == plain_len


def test_a_request_too_long_on_its_own_is_still_refused_for_its_own_length(api):
    context = api.engine.model_config.max_context_len
    r = served_prompt_tokens(api.url, api.model, [USER], max_tokens=context)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
