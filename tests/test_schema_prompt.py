"""A chat `response_format` json_schema is enforced and also stated at the end of the system
message, so a small model knows the shape it is held to; `--no-schema-in-prompt` only enforces."""
from __future__ import annotations

import json

import httpx

from radixserve.api.openai.chat_prompt import render_chat_prompt, with_schema_instruction
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
