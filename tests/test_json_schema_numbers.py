"""Runaway values, on both backends over the default model's vocabulary: a number the schema leaves
unbounded has at most 16 integer digits, 16 fraction digits and 2 exponent digits (with xgrammar
also inside free-form values and tool-call arguments), and JSON is compact unless free whitespace is asked
for. What is refused stays refused."""
from __future__ import annotations

import pytest

from radixserve.grammar import GrammarError, GrammarSpec, make_grammar_backend

BACKENDS = ("xgrammar", "outlines-core")
POINT = {"type": "object", "properties": {"x": {"type": "number"}, "n": {"type": "integer"}},
         "required": ["x", "n"], "additionalProperties": False}


@pytest.fixture(scope="module")
def vocab(default_model_files, default_tokenizer):
    return default_tokenizer.vocab_info(default_model_files.config.vocab_size)


@pytest.fixture(scope="module")
def backends(vocab):
    return {(name, free): make_grammar_backend(name, vocab, any_whitespace=free)
            for name in BACKENDS for free in (False, True)}


@pytest.fixture(scope="module")
def accepts(backends, default_tokenizer, vocab):
    compiled = {}

    def check(backend: str, spec: GrammarSpec, text: str, free: bool = False) -> bool:
        grammar = backends[backend, free]
        if (backend, free, spec) not in compiled:
            compiled[backend, free, spec] = grammar.compile(spec)
        matcher = grammar.matcher(compiled[backend, free, spec])
        return (all(matcher.accept_token(t) for t in default_tokenizer.encode(text, add_special_tokens=False))
                and matcher.accept_token(vocab.stop_token_ids[0]))
    return check


@pytest.mark.parametrize("backend", BACKENDS)
def test_unbounded_numbers_get_at_most_16_integer_and_16_fraction_digits(accepts, backend):
    spec = GrammarSpec.json_schema(POINT)
    assert accepts(backend, spec, '{"x":-1234567890123456.1234567890123456,"n":1234567890123456}')
    assert not accepts(backend, spec, '{"x":12345678901234567,"n":1}')
    assert not accepts(backend, spec, '{"x":0.12345678901234567,"n":1}')
    assert not accepts(backend, spec, '{"x":1,"n":12345678901234567}')
    assert accepts(backend, spec, '{"x":5,"n":-7}')


@pytest.mark.parametrize("backend", BACKENDS)
def test_exponent_digits_are_bounded(accepts, backend):
    spec = GrammarSpec.json_schema(POINT)
    assert accepts(backend, spec, '{"x":1.5e+12,"n":0}')
    assert not accepts(backend, spec, '{"x":1.5e+123,"n":0}')


def test_numbers_in_free_form_values_are_bounded_too(accepts):
    # xgrammar only: outlines-core's generic JSON automaton grows too large with bounded numbers
    spec = GrammarSpec.json_object()
    assert accepts("xgrammar", spec, '{"a":[1.25,{"b":-3}]}')
    assert not accepts("xgrammar", spec, '{"a":[1.12345678901234567]}')


def test_one_sided_range_is_bounded_on_its_open_side(accepts):
    spec = GrammarSpec.json_schema({"type": "integer", "minimum": 0})
    assert accepts("xgrammar", spec, "9999999999999999")
    assert not accepts("xgrammar", spec, "10000000000000000")
    assert not accepts("xgrammar", spec, "-1")


def test_integer_bound_past_64_bits_compiles(accepts):
    spec = GrammarSpec.json_schema({"type": "integer", "minimum": 0, "maximum": 18446744073709551615})
    assert accepts("xgrammar", spec, "42")


def test_tool_call_arguments_are_bounded(accepts):
    spec = GrammarSpec.structural_tag({"tags": [{"begin": "<tool_call>", "schema": POINT, "end": "</tool_call>"}],
                                       "triggers": ["<tool_call>"]})
    assert accepts("xgrammar", spec, 'Sure. <tool_call>{"x":2.5,"n":3}</tool_call>')
    assert not accepts("xgrammar", spec, '<tool_call>{"x":2.12345678901234567,"n":3}</tool_call>')


@pytest.mark.parametrize("backend", BACKENDS)
def test_json_is_compact_unless_free_whitespace_is_asked_for(accepts, backend):
    spec = GrammarSpec.json_schema(POINT)
    assert accepts(backend, spec, '{"x":1,"n":2}')
    assert not accepts(backend, spec, '{"x": 1, "n": 2}')
    assert not accepts(backend, spec, '{"x":1,\n"n":2}')
    assert accepts(backend, spec, '{ "x" : 1,\n  "n": 2 }', free=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_refusals_stay_refusals(backends, backend):
    with pytest.raises(GrammarError, match="unsupported keyword 'uniqueItems'"):
        backends[backend, False].compile(GrammarSpec.json_schema({"type": "array", "uniqueItems": True}))
