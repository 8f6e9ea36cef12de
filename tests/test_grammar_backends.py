"""Both grammar backends over the default model's vocabulary: matchers walk known-valid text token
by token, bitmask rows agree with what matchers accept, stop tokens only where the grammar may
end, and every invalid or unenforceable spec fails with an error that names the problem.

outlines-core supports json_schema, json_object, regex and choice; not ebnf or structural_tag."""
from __future__ import annotations

import json
import random

import pytest
import torch

from radixserve.grammar import GrammarError, GrammarSpec, make_grammar_backend

BACKENDS = ("xgrammar", "outlines-core")
KINDS_OF = {"xgrammar": {"json_schema", "json_object", "regex", "ebnf", "choice", "structural_tag"},
            "outlines-core": {"json_schema", "json_object", "regex", "choice"}}

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 20},
    "age": {"type": "integer"},
    "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "bc"]}, "maxItems": 3},
    "email": {"anyOf": [{"type": "string", "format": "email"}, {"type": "null"}]},
}, "required": ["name", "age", "tags", "email"], "additionalProperties": False}
TOOL = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}

# kind -> (spec, a valid text none of whose proper token prefixes is itself complete); JSON is
# generated compact (no whitespace between tokens) unless the backend is asked for free whitespace
CASES = {
    "json_schema": (GrammarSpec.json_schema(PERSON),
                    json.dumps({"name": "Bob", "age": 42, "tags": ["a", "bc"], "email": None}, separators=(",", ":"))),
    "json_object": (GrammarSpec.json_object(), '{"a":[1,2.5],"b":{"c":null,"d":"x"}}'),
    "regex": (GrammarSpec.regex(r"[a-z]+@[a-z]+\.com"), "bob@site.com"),
    "ebnf": (GrammarSpec.ebnf('root ::= "(" [a-z]+ ")"'), "(abc)"),
    "choice": (GrammarSpec.choice(["yes", "no", "maybe so"]), "maybe so"),
    "structural_tag": (GrammarSpec.structural_tag({
        "tags": [{"begin": "<tool_call>", "schema": TOOL, "end": "</tool_call>"}], "triggers": ["<tool_call>"]}),
        'Let me check. <tool_call>{"city":"Paris"}</tool_call>'),
}
SUPPORTED = [(b, k) for b in BACKENDS for k in CASES if k in KINDS_OF[b]]


@pytest.fixture(scope="module")
def vocab(default_model_files, default_tokenizer):
    return default_tokenizer.vocab_info(default_model_files.config.vocab_size)


@pytest.fixture(scope="module")
def backends(vocab):
    return {name: make_grammar_backend(name, vocab) for name in BACKENDS}


@pytest.fixture(scope="module")
def compiled(backends):
    """Compile each (backend, kind) case once per module (outlines' generic JSON index takes seconds)."""
    cache = {}

    def get(backend: str, kind: str):
        if (backend, kind) not in cache:
            cache[backend, kind] = backends[backend].compile(CASES[kind][0])
        return cache[backend, kind]
    return get


def allowed_ids(bitmask: torch.Tensor, row: int) -> set[int]:
    words = bitmask[row].tolist()
    return {w * 32 + j for w, word in enumerate(words) if word for j in range(32) if (word >> j) & 1}


def new_matcher(backends, compiled, backend, kind):
    return backends[backend].matcher(compiled(backend, kind))


@pytest.mark.parametrize("backend,kind", SUPPORTED)
def test_valid_text_is_accepted_token_by_token_then_terminates(backends, compiled, default_tokenizer, vocab,
                                                               backend, kind):
    matcher = new_matcher(backends, compiled, backend, kind)
    for token in default_tokenizer.encode(CASES[kind][1], add_special_tokens=False):
        assert matcher.accept_token(token), default_tokenizer.token_text(token)
    assert not matcher.is_terminated()
    assert matcher.accept_token(vocab.stop_token_ids[-1])
    assert matcher.is_terminated()
    assert not matcher.accept_token(default_tokenizer.encode("a", add_special_tokens=False)[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_invalid_token_is_rejected_and_state_kept(backends, compiled, default_tokenizer, backend):
    matcher = new_matcher(backends, compiled, backend, "json_schema")
    assert not matcher.accept_token(default_tokenizer.encode("hello", add_special_tokens=False)[0])
    for token in default_tokenizer.encode(CASES["json_schema"][1], add_special_tokens=False):
        assert matcher.accept_token(token)


@pytest.mark.parametrize("backend,kind", SUPPORTED)
def test_filled_row_allows_exactly_the_tokens_the_matcher_accepts(backends, compiled, default_tokenizer, vocab,
                                                                  backend, kind):
    tokens = default_tokenizer.encode(CASES[kind][1], add_special_tokens=False)
    prefix = tokens[:len(tokens) // 2]
    matcher = new_matcher(backends, compiled, backend, kind)
    for token in prefix:
        assert matcher.accept_token(token)
    bitmask = backends[backend].allocate_bitmask(3)
    backends[backend].fill_bitmask([matcher], bitmask, [2])
    allowed = allowed_ids(bitmask, 2)
    rng = random.Random(0)
    sample = sorted(allowed)[:40] + rng.sample(range(vocab.model_vocab_size), 120) + sorted(vocab.special_token_ids)
    for token in sample:
        matcher.reset()
        for t in prefix:
            assert matcher.accept_token(t)
        assert matcher.accept_token(token) == (token in allowed), token
    assert not bitmask[:2].any(), "rows not asked for were written"


@pytest.mark.parametrize("backend,kind", [c for c in SUPPORTED if c[1] != "structural_tag"])
def test_stop_tokens_are_allowed_only_where_the_grammar_may_end(backends, compiled, default_tokenizer, vocab,
                                                                backend, kind):
    matcher = new_matcher(backends, compiled, backend, kind)
    bitmask = backends[backend].allocate_bitmask(1)
    tokens = default_tokenizer.encode(CASES[kind][1], add_special_tokens=False)
    for i, token in enumerate(tokens + [None]):
        backends[backend].fill_bitmask([matcher], bitmask, [0])
        allowed = allowed_ids(bitmask, 0)
        at_end = token is None
        assert all((stop in allowed) == at_end for stop in vocab.stop_token_ids), f"after {i} tokens"
        assert not allowed & vocab.special_token_ids - set(vocab.stop_token_ids)
        if token is not None:
            assert not matcher.accept_token(vocab.stop_token_ids[0])
            assert matcher.accept_token(token)


def test_structural_tag_allows_stop_in_free_text_but_not_inside_a_tag(backends, compiled, default_tokenizer,
                                                                      vocab):
    backend = backends["xgrammar"]
    matcher = backend.matcher(compiled("xgrammar", "structural_tag"))
    bitmask = backend.allocate_bitmask(1)
    text = CASES["structural_tag"][1]
    inside = text[:text.index("</tool_call>")]
    for token in default_tokenizer.encode("Let me check.", add_special_tokens=False):
        assert matcher.accept_token(token)
    backend.fill_bitmask([matcher], bitmask, [0])
    assert vocab.stop_token_ids[0] in allowed_ids(bitmask, 0)
    matcher.reset()
    for token in default_tokenizer.encode(inside, add_special_tokens=False):
        assert matcher.accept_token(token)
    backend.fill_bitmask([matcher], bitmask, [0])
    assert not set(vocab.stop_token_ids) & allowed_ids(bitmask, 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_padding_ids_of_a_wider_model_vocab_are_never_allowed(default_tokenizer, backend):
    padded = default_tokenizer.vocab_info(default_tokenizer.vocab_size + 100)
    grammar = make_grammar_backend(backend, padded)
    matcher = grammar.matcher(grammar.compile(GrammarSpec.regex(r"[a-z ]*")))
    bitmask = grammar.allocate_bitmask(1)
    assert bitmask.shape[1] == (default_tokenizer.vocab_size + 100 + 31) // 32
    grammar.fill_bitmask([matcher], bitmask, [0])
    allowed = allowed_ids(bitmask, 0)
    assert len(allowed) > 1000
    assert not {a for a in allowed if default_tokenizer.vocab_size <= a < padded.model_vocab_size}
    assert not matcher.accept_token(default_tokenizer.vocab_size + 5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_choice_options_match_literally(backends, default_tokenizer, backend):
    grammar = backends[backend]
    compiled = grammar.compile(GrammarSpec.choice(["a.b", "(x)"]))

    def accepts(text: str) -> bool:
        matcher = grammar.matcher(compiled)
        return all(matcher.accept_token(t) for t in default_tokenizer.encode(text, add_special_tokens=False))
    assert accepts("a.b") and accepts("(x)")
    assert not accepts("axb") and not accepts("x")


@pytest.mark.parametrize("backend", BACKENDS)
def test_regex_dot_does_not_match_a_newline(backends, default_tokenizer, backend):
    grammar = backends[backend]
    matcher = grammar.matcher(grammar.compile(GrammarSpec.regex("a.c")))
    assert matcher.accept_token(default_tokenizer.encode("a", add_special_tokens=False)[0])
    assert not matcher.accept_token(default_tokenizer.encode("\n", add_special_tokens=False)[0])


def test_xgrammar_enforces_integer_bounds(backends, default_tokenizer, vocab):
    grammar = backends["xgrammar"]
    compiled = grammar.compile(GrammarSpec.json_schema({"type": "integer", "minimum": 5, "maximum": 12}))

    def complete(text: str) -> bool:
        matcher = grammar.matcher(compiled)
        return (all(matcher.accept_token(t) for t in default_tokenizer.encode(text, add_special_tokens=False))
                and matcher.accept_token(vocab.stop_token_ids[0]))
    assert complete("7") and complete("12")
    assert not complete("3") and not complete("13") and not complete("-5")


@pytest.mark.parametrize("kind", ["ebnf", "structural_tag"])
def test_outlines_core_rejects_unsupported_kind_by_name(backends, kind):
    with pytest.raises(GrammarError, match=f"{kind}: not supported by the outlines-core grammar backend"):
        backends["outlines-core"].compile(CASES[kind][0])


# (backends, spec, fragment of the error message)
INVALID = [
    (BACKENDS, lambda: GrammarSpec.json_schema({"type": "integer", "minimum": "five"}),
     r"json_schema: invalid schema: 'five' is not of type 'number' at /minimum"),
    (BACKENDS, lambda: GrammarSpec.json_schema('{"type": '), "json_schema: not valid JSON"),
    (BACKENDS, lambda: GrammarSpec.regex("([a-z]+"), "regex: missing \\), unterminated subpattern at position 0"),
    (BACKENDS, lambda: GrammarSpec.regex("(?=a)a"), "regex: lookaround assertion is not supported"),
    (("xgrammar",), lambda: GrammarSpec.ebnf('root ::= "a" |'), "ebnf: "),
    (("xgrammar",), lambda: GrammarSpec.ebnf('root ::= undefined_rule'), "ebnf: .*undefined_rule"),
    (BACKENDS, lambda: GrammarSpec.json_schema({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}),
     "json_schema: unsupported keyword 'uniqueItems' .* at /"),
    (BACKENDS, lambda: GrammarSpec.json_schema({"not": {"type": "string"}}), "unsupported keyword 'not'"),
    (BACKENDS, lambda: GrammarSpec.json_schema({"type": "object", "properties": {"a": {"type": "integer"}},
                                                "if": {"required": ["a"]}, "then": {"minProperties": 1}}),
     "unsupported keyword 'if'"),
    (("outlines-core",), lambda: GrammarSpec.json_schema(
        {"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 150}}}),
     "unsupported keyword 'minimum' \\(outlines-core cannot enforce it\\) at /properties/age"),
    (("outlines-core",), lambda: GrammarSpec.json_schema({"type": "number", "exclusiveMaximum": 1}),
     "unsupported keyword 'exclusiveMaximum'"),
    (BACKENDS, lambda: GrammarSpec.json_schema({"type": "string", "pattern": "^(?!x)[a-z]+$"}),
     "json_schema: pattern '\\^\\(\\?!x\\)\\[a-z\\]\\+\\$': lookaround assertions are not supported at /"),
    (BACKENDS, lambda: GrammarSpec.json_schema({"oneOf": [{"type": "integer"}, {"type": "string", "minLength": 3},
                                                          {"type": "string"}]}),
     "'oneOf' whose branches may overlap"),
    (BACKENDS, lambda: GrammarSpec.json_schema({"type": "object", "required": ["a"], "additionalProperties": False}),
     "unsatisfiable: required property 'a' is not declared in 'properties' and 'additionalProperties' is false"),
    (BACKENDS, lambda: GrammarSpec.json_schema({"allOf": [{"type": "string", "pattern": "^a"}, {"pattern": "b$"}]}),
     "two different patterns cannot be combined into one exactly"),
    (("xgrammar",), lambda: GrammarSpec.json_schema({"type": "number", "multipleOf": 0.5}),
     "'multipleOf' on a non-integer type"),
    (("xgrammar",), lambda: GrammarSpec.structural_tag({"tags": [{"begin": "<a>", "schema": {"not": {}}, "end": "</a>"}],
                                                   "triggers": ["<a"]}),
     "structural_tag: tags\\[0\\].schema: unsupported keyword 'not'"),
    (BACKENDS, lambda: GrammarSpec.structural_tag({"tags": [{"begin": "<a>", "schema": {}, "end": "</a>"}],
                                                   "triggers": ["<b"]}),
     "structural_tag: tags\\[0\\].begin '<a>' starts with none of the triggers"),
    (BACKENDS, lambda: GrammarSpec.choice([]), "choice: must be a non-empty list of strings"),
]


@pytest.mark.parametrize("backend,make_spec,message",
                         [(b, make, msg) for names, make, msg in INVALID for b in names],
                         ids=lambda v: v if isinstance(v, str) and len(v) < 20 else None)
def test_invalid_spec_fails_with_a_named_error(backends, backend, make_spec, message):
    with pytest.raises(GrammarError, match=message):
        backends[backend].compile(make_spec())


# refused before the normalisation pass; JSON Schema does not call for refusing them (issue 21)
ONCE_REFUSED = {
    "$ref with a sibling": {"$defs": {"n": {"type": "string"}}, "$ref": "#/$defs/n", "minLength": 3},
    "required, not declared": {"type": "object", "required": ["a"], "properties": {"b": {"type": "string"}},
                               "additionalProperties": {"type": "string"}},
    "allOf of two": {"allOf": [{"type": "integer"}, {"minimum": 3}]},
    "unknown format": {"type": "string", "format": "idn-email"},
    "anchored alternatives": {"type": "string", "pattern": "^a$|^b$"},
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ONCE_REFUSED)
def test_schemas_json_schema_does_not_refuse_compile(backends, backend, name):
    spec = GrammarSpec.json_schema(ONCE_REFUSED[name])
    if backend == "outlines-core" and name == "allOf of two":
        # the merge is exact, but outlines-core cannot enforce the merged minimum: refused by keyword
        with pytest.raises(GrammarError, match="minimum"):
            backends[backend].compile(spec)
        return
    backends[backend].compile(spec)


@pytest.mark.parametrize("backend", BACKENDS)
def test_schema_features_both_backends_enforce_compile(backends, backend):
    schema = {
        "$defs": {"point": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}},
        "type": "object",
        "properties": {
            "id": {"type": "string", "pattern": "^[a-z]{3}$"},
            "kind": {"enum": ["a", "b"]},
            "const": {"const": 1},
            "p": {"$ref": "#/$defs/point", "description": "annotations may sit beside $ref"},
            "items": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 4},
            "maybe": {"type": ["string", "null"]},
            "shape": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
        },
        "required": ["id", "kind"],
    }
    backends[backend].compile(GrammarSpec.json_schema(schema))


@pytest.mark.parametrize("backend", BACKENDS)
def test_allocating_a_bitmask_runs_no_torch_kernel(backends, backend):
    # it runs on a request's thread: a parallel torch kernel there would start a second OpenMP
    # team, and libgomp then throttles the engine thread's team too (see allocate_bitmask)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        bitmask = backends[backend].allocate_bitmask(64)
    assert not bitmask.any()
    kernels = {e.name for e in prof.events() if e.name.startswith("aten::")} - {"aten::lift_fresh"}  # a no-op wrap
    assert kernels == set()


@pytest.mark.parametrize("key", ["é06C9", "ÿF", "中0abc", "🙂ab"])
def test_a_non_ascii_character_before_hex_digits_keeps_its_meaning(backends, default_tokenizer, key):
    # xgrammar prints "é0" as \xe90, which its own parser reads back as one other character
    schema = {"type": "object", "additionalProperties": False, "required": [key], "properties": {key: {"type": "boolean"}}}
    backend = backends["xgrammar"]
    matcher = backend.matcher(backend.compile(GrammarSpec("json_schema", schema)))
    assert all(matcher.accept_token(t) for t in default_tokenizer.encode(json.dumps({key: True}, ensure_ascii=False,
                                                                                 separators=(",", ":")),
                                                                      add_special_tokens=False))
