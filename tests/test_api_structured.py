"""Structured output through every spelling clients use (OpenAI, vLLM, SGLang): the reply
validates or matches; a bad schema, regex or grammar is a 400 before any token.
Needs the grammar path in the engine."""
from __future__ import annotations

import json
import re

import httpx
import jsonschema
import pytest

PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 12},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
PHONE = r"[0-9]{3}-[0-9]{4}"
CITIES = ["Paris", "London", "Berlin"]
EBNF = 'root ::= ("yes" | "no") "!"'


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def is_person(text: str) -> None:
    jsonschema.validate(json.loads(text), PERSON)


def is_phone(text: str) -> None:
    assert re.fullmatch(PHONE, text), text


def is_city(text: str) -> None:
    assert text in CITIES, text


def is_yes_no(text: str) -> None:
    assert text in ("yes!", "no!"), text


def is_json_object(text: str) -> None:
    assert isinstance(json.loads(text), dict), text


# What each kind of constraint asks for, phrased so the small model finishes well within max_tokens.
PROMPTS = {
    is_person: "Describe a person (name and age) as JSON.",
    is_json_object: 'Give the capital of France as a JSON object with one key, "answer".',
    is_phone: "Give me a phone number.",
    is_city: "Name a European capital.",
    is_yes_no: "Is Paris in France? Answer yes or no.",
}

SPELLINGS = {
    "response_format json_schema": ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "person", "schema": PERSON, "strict": True}}}, is_person),
    "response_format json_object": ({"response_format": {"type": "json_object"}}, is_json_object),
    "structured_outputs json": ({"structured_outputs": {"json": PERSON}}, is_person),
    "structured_outputs regex": ({"structured_outputs": {"regex": PHONE}}, is_phone),
    "structured_outputs choice": ({"structured_outputs": {"choice": CITIES}}, is_city),
    "structured_outputs grammar": ({"structured_outputs": {"grammar": EBNF}}, is_yes_no),
    "sglang regex": ({"regex": PHONE}, is_phone),
    "sglang ebnf": ({"ebnf": EBNF}, is_yes_no),
    "sglang json_schema": ({"json_schema": json.dumps(PERSON)}, is_person),
    "guided_json": ({"guided_json": PERSON}, is_person),
    "guided_regex": ({"guided_regex": PHONE}, is_phone),
    "guided_choice": ({"guided_choice": CITIES}, is_city),
    "guided_grammar": ({"guided_grammar": EBNF}, is_yes_no),
}


@pytest.mark.parametrize("spelling", list(SPELLINGS))
def test_every_constraint_spelling_is_enforced(api, spelling):
    extra, check = SPELLINGS[spelling]
    r = api.client().chat.completions.create(model=api.model, messages=ask(PROMPTS[check]), max_tokens=48,
                                             temperature=0, extra_body=extra)
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    check(r.choices[0].message.content)


def test_completions_endpoint_enforces_a_constraint_too(api):
    r = api.client().completions.create(model=api.model, prompt="My phone number is ", max_tokens=16,
                                        temperature=0, extra_body={"guided_regex": PHONE})
    is_phone(r.choices[0].text)


def test_sampled_constrained_choices_all_validate(api):
    r = api.client().chat.completions.create(
        model=api.model, messages=ask("Invent a person."), n=3, max_tokens=48, temperature=1.0, seed=3,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}})
    for choice in r.choices:
        is_person(choice.message.content)


def test_streamed_constrained_reply_equals_the_whole_one(api):
    kw = dict(model=api.model, messages=ask("Invent a person."), max_tokens=48, temperature=0,
              extra_body={"guided_json": PERSON})
    client = api.client()
    whole = client.chat.completions.create(**kw).choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kw)
                       if c.choices)
    assert streamed == whole
    is_person(streamed)


@pytest.mark.parametrize("extra,param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"type": "strin"}}}}}}, "response_format#/properties/a/type"),
    ({"guided_json": {"type": "object", "not": {"required": ["a"]}}}, "guided_json#/not"),
    ({"guided_regex": "([a-z"}, "guided_regex"),
    ({"regex": "(?<=a)b"}, "regex"),
    ({"structured_outputs": {"grammar": "root ::= ("}}, "structured_outputs"),
    ({"guided_choice": []}, "guided_choice"),
])
@pytest.mark.parametrize("stream", [False, True])
def test_invalid_or_unenforceable_constraint_is_400_before_any_token(api, extra, param, stream):
    body = {"model": api.model, "messages": ask("Hi"), "max_tokens": 8, "stream": stream, **extra}
    r = httpx.post(api.base_url + "/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
