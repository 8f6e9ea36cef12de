"""Structured output through the engine on the real default model: every constrained output parses
and validates, constrained requests do not disturb unconstrained neighbours, bad specs fail by name
before any token, and nothing leaks."""
from __future__ import annotations

import json
import re

import jsonschema
import pytest

from radixserve.grammar import GrammarSpec
from radixserve.runtime.engine_client import EngineRefusal, RefusalKind
from radixserve.runtime.sampling_params import SamplingParams

PERSON = "Reply with a JSON object about a person called Ada who is 36."

SCHEMAS: dict[str, dict] = {
    "required_and_optional": {
        "type": "object", "additionalProperties": False, "required": ["name"],
        "properties": {"name": {"type": "string", "maxLength": 12}, "nick": {"type": "string", "maxLength": 8}}},
    "integer_bounds": {
        "type": "object", "additionalProperties": False, "required": ["age"],
        "properties": {"age": {"type": "integer", "minimum": 40, "maximum": 65}}},
    "number_bounds": {
        "type": "object", "additionalProperties": False, "required": ["score"],
        "properties": {"score": {"type": "number", "minimum": 0, "maximum": 1}}},
    "enum": {
        "type": "object", "additionalProperties": False, "required": ["color"],
        "properties": {"color": {"enum": ["red", "green", "blue"]}}},
    "const": {
        "type": "object", "additionalProperties": False, "required": ["version", "kind"],
        "properties": {"version": {"const": 2}, "kind": {"const": "user"}}},
    "array_bounds": {
        "type": "object", "additionalProperties": False, "required": ["tags"],
        "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 6},
                                "minItems": 2, "maxItems": 3}}},
    "string_pattern": {
        "type": "object", "additionalProperties": False, "required": ["zip"],
        "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}}},
    "string_format": {
        "type": "object", "additionalProperties": False, "required": ["born"],
        "properties": {"born": {"type": "string", "format": "date"}}},
    "string_lengths": {
        "type": "object", "additionalProperties": False, "required": ["code"],
        "properties": {"code": {"type": "string", "minLength": 3, "maxLength": 5}}},
    "defs_and_ref": {
        "$defs": {"point": {"type": "object", "additionalProperties": False, "required": ["x", "y"],
                            "properties": {"x": {"type": "integer", "minimum": -9, "maximum": 9},
                                           "y": {"type": "integer", "minimum": -9, "maximum": 9}}}},
        "type": "object", "additionalProperties": False, "required": ["a", "b"],
        "properties": {"a": {"$ref": "#/$defs/point"}, "b": {"$ref": "#/$defs/point"}}},
    "draft07_definitions": {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "definitions": {"name": {"type": "string", "maxLength": 10}},
        "type": "object", "additionalProperties": False, "required": ["first", "last"],
        "properties": {"first": {"$ref": "#/definitions/name"}, "last": {"$ref": "#/definitions/name"}}},
    "any_of": {
        "type": "object", "additionalProperties": False, "required": ["id"],
        "properties": {"id": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 999},
                                        {"type": "string", "maxLength": 8}]}}},
    "one_of": {
        "oneOf": [
            {"type": "object", "additionalProperties": False, "required": ["kind", "lives"],
             "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer", "minimum": 1, "maximum": 9}}},
            {"type": "object", "additionalProperties": False, "required": ["kind", "good"],
             "properties": {"kind": {"const": "dog"}, "good": {"type": "boolean"}}}]},
    "nullable": {
        "type": "object", "additionalProperties": False, "required": ["middle"],
        "properties": {"middle": {"type": ["string", "null"], "maxLength": 10}}},
    "nested_objects": {
        "type": "object", "additionalProperties": False, "required": ["people"],
        "properties": {"people": {"type": "array", "maxItems": 2, "items": {
            "type": "object", "additionalProperties": False, "required": ["name", "adult"],
            "properties": {"name": {"type": "string", "maxLength": 8}, "adult": {"type": "boolean"}}}}}},
}


def assert_valid(text: str, schema: dict) -> None:
    value = json.loads(text)
    jsonschema.validate(value, schema, format_checker=jsonschema.FormatChecker())


@pytest.fixture(scope="module")
def chat_prompt(default_tokenizer):
    return default_tokenizer.apply_chat_template([{"role": "user", "content": PERSON}])


def schema_params(schema, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=200, constraint=GrammarSpec.json_schema(schema), **kw)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_every_schema_output_validates(make_engine, chat_prompt, temperature):
    engine = make_engine()
    names = list(SCHEMAS)
    params = [schema_params(SCHEMAS[n], temperature=temperature, seed=i) for i, n in enumerate(names)]
    results = engine.generate([chat_prompt] * len(names), params)
    for name, r in zip(names, results):
        assert r.finish_reason == "stop", (name, r.text)
        assert_valid(r.text, SCHEMAS[name])


def test_json_object_output_is_an_object(make_engine, default_tokenizer):
    engine = make_engine()
    prompt = default_tokenizer.apply_chat_template(
        [{"role": "user", "content": "Return a JSON object with keys name and age for Ada, 36."}])
    r = engine.generate(prompt, SamplingParams(max_tokens=200, temperature=0.0,
                                                    constraint=GrammarSpec.json_object()))[0]
    assert r.finish_reason == "stop"
    assert isinstance(json.loads(r.text), dict)


def test_regex_output_matches_in_full(make_engine, chat_prompt):
    engine = make_engine()
    pattern = r"(Ada|Bob) is [1-9][0-9]? years old\."
    for seed in range(3):
        r = engine.generate(chat_prompt, SamplingParams(max_tokens=32, temperature=1.0, seed=seed,
                                                        constraint=GrammarSpec.regex(pattern)))[0]
        assert r.finish_reason == "stop"
        assert re.fullmatch(pattern, r.text), r.text


def test_choice_output_is_one_of_the_choices(make_engine, default_tokenizer):
    engine = make_engine()
    prompt = default_tokenizer.apply_chat_template([{"role": "user", "content": "Is the sky green?"}])
    options = ["yes", "no", "maybe not"]
    for seed in range(3):
        r = engine.generate(prompt, SamplingParams(max_tokens=8, temperature=1.0, seed=seed,
                                                   constraint=GrammarSpec.choice(options)))[0]
        assert r.text in options


def test_ebnf_output_follows_the_grammar(make_engine, chat_prompt):
    engine = make_engine()
    grammar = 'root ::= "age=" digit digit? ";"\ndigit ::= [0-9]'
    r = engine.generate(chat_prompt, SamplingParams(max_tokens=16, temperature=0.0,
                                                    constraint=GrammarSpec.ebnf(grammar)))[0]
    assert re.fullmatch(r"age=[0-9][0-9]?;", r.text), r.text


def test_constrained_neighbours_leave_unconstrained_outputs_unchanged(make_engine, default_tokenizer):
    engine = make_engine()
    questions = ["What is the capital of France?", "Name a fruit.", "Count to five.", "Say hello.",
                 "What colour is grass?", "Name a planet.", "What is 2 + 2?", "Write a short greeting."]
    free = [default_tokenizer.apply_chat_template([{"role": "user", "content": q}]) for q in questions]
    plain = SamplingParams(max_tokens=24, temperature=0.0)
    alone = engine.generate(free, plain)

    names = list(SCHEMAS)[:5]
    constrained = [schema_params(SCHEMAS[n], temperature=0.0) for n in names] + [
        SamplingParams(max_tokens=32, temperature=0.0, constraint=GrammarSpec.regex(r"[A-Z][a-z]{2,8}")),
        SamplingParams(max_tokens=8, temperature=0.0, constraint=GrammarSpec.choice(["left", "right"])),
        SamplingParams(max_tokens=16, temperature=0.0, constraint=GrammarSpec.ebnf('root ::= "age=" [0-9] [0-9]? ";"'))]
    person = default_tokenizer.apply_chat_template([{"role": "user", "content": PERSON}])
    prompts, params = [], []
    for i in range(8):  # interleave so that constrained and free rows alternate in the batch
        prompts += [person, free[i]]
        params += [constrained[i], plain]
    mixed = engine.generate(prompts, params)
    assert [r.text for r in mixed[1::2]] == [r.text for r in alone]
    for name, r in zip(names, mixed[0:10:2]):
        assert_valid(r.text, SCHEMAS[name])
    assert re.fullmatch(r"[A-Z][a-z]{2,8}", mixed[10].text)
    assert mixed[12].text in ("left", "right")
    assert re.fullmatch(r"age=[0-9][0-9]?;", mixed[14].text)


def test_constrained_rows_of_a_mixed_batch_are_masked_as_one_block(make_engine, default_tokenizer):
    # the engine orders rows so that the mask is applied to one block of logits rows, not gathered
    engine = make_engine()
    applied: list[tuple[int, list[int]]] = []
    real_apply = engine.structured.apply

    def recording_apply(logits, rows):
        applied.append((logits.shape[0], list(rows)))
        real_apply(logits, rows)

    engine.structured.apply = recording_apply
    prompt = default_tokenizer.apply_chat_template([{"role": "user", "content": "Name a colour."}])
    constrained = SamplingParams(max_tokens=24, temperature=0.0, constraint=GrammarSpec.regex(r"[a-z]{30,40}"))
    free = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    streams = []
    for i in range(6):  # each joins once the one before has a token: free and constrained alternate
        streams.append(engine.submit(prompt, constrained if i % 2 else free))
        next(iter(streams[-1]))
    for stream in streams:
        stream.wait_finished()
    mixed = [(n, rows) for n, rows in applied if 0 < len(rows) < n]
    assert any(n >= 4 for n, _ in mixed), "no step had several constrained and free rows together"
    for _, rows in mixed:
        assert rows == list(range(rows[0], rows[0] + len(rows)))


def test_hitting_max_tokens_reports_length_without_closing_the_json(make_engine, chat_prompt):
    engine = make_engine()
    schema = {"type": "object", "required": ["story"], "additionalProperties": False,
              "properties": {"story": {"type": "string", "minLength": 200}}}
    r = engine.generate(chat_prompt, SamplingParams(max_tokens=10, temperature=0.0,
                                                    constraint=GrammarSpec.json_schema(schema)))[0]
    assert r.finish_reason == "length"
    assert len(r.token_ids) == 10
    with pytest.raises(json.JSONDecodeError):
        json.loads(r.text)


@pytest.mark.parametrize("spec, named", [
    (lambda: GrammarSpec.regex("([a-"), "regex"),
    (lambda: GrammarSpec.ebnf('root ::= "a" missing_rule'), "ebnf"),
    (lambda: GrammarSpec.json_schema({"type": "object", "properties": {"n": {"type": "integer", "minimum": "x"}}}),
     "json_schema"),
])
def test_invalid_spec_fails_by_name_before_any_token(make_engine, chat_prompt, spec, named):
    engine = make_engine()
    try:
        params = SamplingParams(max_tokens=8, constraint=spec())
    except ValueError as e:  # some specs are rejected as soon as they are built
        assert str(e).startswith(named)
        return
    try:
        outputs = list(engine.submit(chat_prompt, params))
    except EngineRefusal as e:
        assert e.kind is RefusalKind.GRAMMAR and e.field == "constraint" and e.message.startswith(named)
        return
    assert len(outputs) == 1 and outputs[0].finish_reason == "error"
    refusal = outputs[0].refusal
    assert refusal is not None and refusal.kind is RefusalKind.GRAMMAR and refusal.message.startswith(named)
    assert outputs[0].token_ids == []


def test_unenforceable_keyword_is_rejected_by_name(make_engine, chat_prompt):
    engine = make_engine()
    schema = {"type": "object", "required": ["tags"],
              "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}}}
    outputs = list(engine.submit(chat_prompt, SamplingParams(max_tokens=8,
                                                             constraint=GrammarSpec.json_schema(schema))))
    assert outputs[-1].finish_reason == "error" and "uniqueItems" in outputs[-1].error
    assert outputs[-1].refusal.keyword == "uniqueItems"
    assert outputs[-1].refusal.pointer == "/properties/tags/uniqueItems"   # the keyword, in the schema as sent
    assert outputs[-1].token_ids == []


def test_compile_timeout_fails_the_request(make_engine, chat_prompt):
    engine = make_engine(grammar_compile_timeout=1e-6)
    schema = {"type": "object", "properties": {f"field_{i}": {"type": "string", "pattern": "^[a-z]{1,9}$"}
                                               for i in range(40)}}
    outputs = list(engine.submit(chat_prompt, SamplingParams(max_tokens=8,
                                                             constraint=GrammarSpec.json_schema(schema))))
    assert outputs[-1].finish_reason == "error" and "timed out" in outputs[-1].error


def test_abort_while_the_grammar_compiles_ends_the_stream(make_engine, chat_prompt):
    engine = make_engine()
    schema = {"type": "object", "properties": {f"key_{i}": {"type": "string", "pattern": "^[a-z]{2,7}[0-9]$"}
                                               for i in range(60)}}
    stream = engine.submit(chat_prompt, SamplingParams(max_tokens=64, constraint=GrammarSpec.json_schema(schema)))
    engine.abort(stream.request_id)
    outputs = list(stream)
    assert outputs[-1].finish_reason == "abort"
    assert not engine.structured.pending


def test_unsupported_kind_of_the_selected_backend_is_rejected_at_submit(make_engine, chat_prompt):
    engine = make_engine(grammar_backend="outlines-core")
    with pytest.raises(EngineRefusal, match="ebnf.*outlines-core") as refused:
        engine.submit(chat_prompt, SamplingParams(constraint=GrammarSpec.ebnf('root ::= "a"')))
    assert refused.value.kind is RefusalKind.GRAMMAR


def test_outlines_core_backend_enforces_what_it_supports(make_engine, chat_prompt):
    engine = make_engine(grammar_backend="outlines-core")
    supported = ["required_and_optional", "enum", "const", "string_pattern", "nullable"]
    results = engine.generate([chat_prompt] * len(supported),
                              [schema_params(SCHEMAS[n], temperature=0.0) for n in supported])
    for name, r in zip(supported, results):
        assert r.finish_reason == "stop", (name, r.text)
        assert_valid(r.text, SCHEMAS[name])
    pattern = r"(Ada|Bob) is [1-9][0-9]? years old\."
    r = engine.generate(chat_prompt, SamplingParams(max_tokens=32, temperature=0.0,
                                                    constraint=GrammarSpec.regex(pattern)))[0]
    assert re.fullmatch(pattern, r.text), r.text


def test_outlines_core_rejects_integer_bounds_it_cannot_enforce(make_engine, chat_prompt):
    engine = make_engine(grammar_backend="outlines-core")
    outputs = list(engine.submit(chat_prompt, schema_params(SCHEMAS["integer_bounds"])))
    assert outputs[-1].finish_reason == "error"
    assert "minimum" in outputs[-1].error or "maximum" in outputs[-1].error


def test_structural_tag_constrains_the_tagged_body(make_engine, default_tokenizer):
    engine = make_engine()
    schema = {"type": "object", "additionalProperties": False, "required": ["city"],
              "properties": {"city": {"type": "string", "maxLength": 20}}}
    tag = {"tags": [{"begin": '<tool_call>{"name": "get_weather", "arguments": ', "schema": schema,
                     "end": "}</tool_call>"}],
           "triggers": ["<tool_call>"], "at_least_one": True, "stop_after_first": True}
    prompt = default_tokenizer.apply_chat_template([{"role": "user", "content": "What is the weather in Paris?"}])
    r = engine.generate(prompt, SamplingParams(max_tokens=64, temperature=0.0,
                                               constraint=GrammarSpec.structural_tag(tag)))[0]
    assert r.finish_reason == "stop", r.text
    match = re.search(r'<tool_call>\{"name": "get_weather", "arguments": (.*)\}</tool_call>$', r.text, re.S)
    assert match, r.text
    assert_valid(match.group(1), schema)
