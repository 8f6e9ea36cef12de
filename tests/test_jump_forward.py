"""Jump-forward decoding: text a grammar forces is appended as the tokenizer's own tokens, the output
stays valid, and the request keeps its limits. The canonical-token rule (grammar/jump_forward.py) is
checked by random walks through xgrammar's grammars with the default model's real vocabulary."""
from __future__ import annotations

import json
import random

import jsonschema
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixserve.grammar import GrammarSpec, make_grammar_backend
from radixserve.grammar.jump_forward import ForcedTokens
from radixserve.runtime.sampling_params import SamplingParams

ORDER = {
    "type": "object", "additionalProperties": False,
    "required": ["customer_full_name", "customer_shipping_address", "preferred_delivery_window",
                 "is_gift_wrapping_requested"],
    "properties": {
        "customer_full_name": {"type": "string", "maxLength": 20},
        "customer_shipping_address": {"type": "string", "maxLength": 30},
        "preferred_delivery_window": {"enum": ["morning_before_noon", "evening_after_six"]},
        "is_gift_wrapping_requested": {"type": "boolean"}}}
PROMPT = "Write the order of customer 7 as JSON."


# ---- the rule, on random walks with the real vocabulary ------------------------------------------
@pytest.fixture(scope="module")
def vocab(default_model_files, default_tokenizer):
    return default_tokenizer.vocab_info(default_model_files.config.vocab_size)


@pytest.fixture(scope="module")
def backend(vocab):
    return make_grammar_backend("xgrammar", vocab)


@pytest.fixture(scope="module")
def forced(default_tokenizer, vocab):
    return ForcedTokens(lambda text: default_tokenizer.encode(text, add_special_tokens=False), vocab.token_bytes)


KEY_CHARS = st.sampled_from(list("abcdefghijklmnopqrstuvwxyzABCXYZ0123456789_-$ .:(é中🙂"))
KEYS = st.text(KEY_CHARS, min_size=1, max_size=24)
LEAVES = st.one_of(
    st.just({"type": "boolean"}),
    st.builds(lambda hi: {"type": "integer", "minimum": 0, "maximum": hi}, st.integers(0, 100000)),
    st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 12)),
    st.builds(lambda vals: {"enum": vals}, st.lists(KEYS, min_size=1, max_size=4, unique=True)),
)


def _objects(children):
    return st.builds(lambda props: {"type": "object", "additionalProperties": False,
                                    "required": list(props), "properties": props},
                     st.dictionaries(KEYS, children, min_size=1, max_size=4))


SCHEMAS = st.recursive(LEAVES, lambda c: st.one_of(
    _objects(c), st.builds(lambda items, n: {"type": "array", "items": items, "maxItems": n}, c, st.integers(0, 3))),
    max_leaves=8).filter(lambda s: s.get("type") == "object")


def _allowed(bitmask) -> np.ndarray:
    return np.nonzero(np.unpackbits(bitmask[0].numpy().view(np.uint8), bitorder="little"))[0]


def _walk(backend, compiled, forced, vocab, rng: random.Random, max_steps: int = 300):
    """Sample uniformly among allowed tokens (a stop token as soon as one is allowed); after each
    sampled token append the forced run, as the engine does. Returns the tokens and each run's span."""
    matcher = backend.matcher(compiled)
    bitmask = backend.allocate_bitmask(1)
    out, runs = [], []
    for _ in range(max_steps):
        matcher.fill_bitmask(bitmask, 0)
        allowed = _allowed(bitmask)
        stops = [t for t in allowed if t in vocab.stop_token_ids]
        token = int(stops[0] if stops else rng.choice(allowed))
        assert matcher.accept_token(token)
        out.append(token)
        if matcher.is_terminated():
            break
        run = list(forced(matcher.forced_string()))
        for t in run:
            assert matcher.accept_token(t), "a forced token the grammar rejects"
        if run:
            runs.append((len(out), len(run)))
            out += run
    return out, runs


def _text(vocab, tokens) -> str:
    data = b"".join(vocab.token_bytes[t] or b"" for t in tokens)
    while data:  # a walk cut at max_steps may end inside a character
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            data = data[:e.start]
    return ""


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=SCHEMAS, seed=st.integers(0, 2**32 - 1))
def test_forced_runs_are_what_the_tokenizer_makes_of_their_text_whatever_follows(
        backend, forced, vocab, default_tokenizer, schema, seed):
    compiled = backend.compile(GrammarSpec("json_schema", schema))
    out, runs = _walk(backend, compiled, forced, vocab, random.Random(seed))
    for start, n in runs:
        run = out[start:start + n]
        followed = _text(vocab, out[start:])
        assert default_tokenizer.encode(followed, add_special_tokens=False)[:n] == run, (
            f"forced run {[vocab.token_bytes[t] for t in run]} is not how the tokenizer splits {followed!r}")


def test_the_last_token_of_a_forced_string_is_left_to_the_model(forced, default_tokenizer):
    text = '_shipping_address":'
    tokens = default_tokenizer.encode(text, add_special_tokens=False)
    run = forced(text)
    assert 0 < len(run) < len(tokens) and list(run) == tokens[:len(run)]


def test_a_forced_run_ends_on_a_character_boundary(forced, vocab):
    for text in ('名前":"', 'café_ñandú":', '🙂🙂":'):
        run = forced(text)
        assert text.encode().startswith(b"".join(vocab.token_bytes[t] for t in run))
        b"".join(vocab.token_bytes[t] for t in run).decode("utf-8")  # whole characters


def test_a_single_token_string_is_not_jumped(forced, default_tokenizer):
    assert len(default_tokenizer.encode('":', add_special_tokens=False)) == 1
    assert forced('":') == ()


# ---- through the engine ------------------------------------------------------------------------
def _params(**kw) -> SamplingParams:
    return SamplingParams(**{"max_tokens": 120, "temperature": 0.0,
                             "constraint": GrammarSpec("json_schema", ORDER), **kw})


def test_forced_keys_are_appended_without_a_step_each(make_engine):
    engine = make_engine()
    steps = engine.steps
    [result] = engine.generate(PROMPT, _params())
    jsonschema.validate(json.loads(result.text), ORDER)
    forced = engine.structured.timings.forced_tokens
    assert forced >= 10
    assert engine.steps - steps <= len(result.token_ids) - forced


def test_no_jump_forward_samples_every_token(make_engine):
    engine = make_engine(jump_forward=False)
    steps = engine.steps
    [result] = engine.generate(PROMPT, _params())
    jsonschema.validate(json.loads(result.text), ORDER)
    assert engine.structured.timings.forced_tokens == 0
    assert engine.steps - steps == len(result.token_ids)


def test_max_tokens_counts_forced_tokens(make_engine):
    engine = make_engine()
    stream = engine.submit(PROMPT, _params(max_tokens=6))
    outs = list(stream)
    assert outs[-1].finish_reason == "length"
    assert sum(len(o.token_ids) for o in outs) == outs[-1].completion_tokens == 6
    assert outs[-1].forced_tokens > 0


def test_forced_tokens_carry_logprob_zero_as_their_only_candidate(make_engine):
    engine = make_engine()
    outs = list(engine.submit(PROMPT, _params(logprobs=2)))
    tokens = [t for o in outs for t in o.token_ids]
    logprobs = [lp for o in outs for lp in o.logprobs]
    assert [lp.token_id for lp in logprobs] == tokens
    certain = [lp for lp in logprobs if lp.top == [(lp.token_id, 0.0)]]
    assert len(certain) >= outs[-1].forced_tokens > 0
    assert all(lp.logprob == 0.0 for lp in certain)


def test_a_stop_string_inside_forced_text_ends_the_request_before_it(make_engine):
    engine = make_engine()
    [result] = engine.generate(PROMPT, _params(stop=["shipping"]))
    assert result.finish_reason == "stop"
    assert result.text.endswith('"customer_')


def test_seeded_sampling_repeats_under_jump_forward(make_engine):
    engine = make_engine()
    [a], [b] = (engine.generate(PROMPT, _params(temperature=1.0, seed=11)) for _ in range(2))
    assert a.token_ids == b.token_ids
    jsonschema.validate(json.loads(a.text), ORDER)


def test_a_batch_of_constrained_requests_equals_each_alone(make_engine):
    engine = make_engine()
    prompts = [f"Write the order of customer {i} as JSON." for i in range(4)]
    alone = [engine.generate(p, _params())[0].token_ids for p in prompts]
    together = [r.token_ids for r in engine.generate(prompts, [_params()] * 4)]
    assert together == alone


# ---- through the server ------------------------------------------------------------------------
WEATHER = {"type": "object", "additionalProperties": False, "required": ["city_name_in_english", "temperature_unit"],
           "properties": {"city_name_in_english": {"type": "string", "maxLength": 20},
                          "temperature_unit": {"enum": ["degrees_celsius", "degrees_fahrenheit"]}}}
TOOLS = [{"type": "function", "function": {"name": "get_current_weather", "parameters": WEATHER}}]


def _forced(usage) -> int:
    return (usage.completion_tokens_details.model_extra or {}).get("forced_tokens", 0)


def test_tool_call_markup_and_arguments_are_jumped(api):
    r = api.client().chat.completions.create(
        model=api.model, messages=[{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS,
        tool_choice="required", max_tokens=80, temperature=0)
    [call] = r.choices[0].message.tool_calls
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    assert not r.choices[0].message.content
    assert 0 < _forced(r.usage) < r.usage.completion_tokens


def test_streamed_text_equals_the_whole_reply_under_jump_forward(api):
    kw = dict(model=api.model, messages=[{"role": "user", "content": PROMPT}], max_tokens=120, temperature=0,
              response_format={"type": "json_schema", "json_schema": {"name": "order", "schema": ORDER}})
    # both on a warm cache: a cold prefill may round a near-tie apart from a warm one (README)
    api.client().chat.completions.create(**{**kw, "max_tokens": 1})
    whole = api.client().chat.completions.create(**kw)
    chunks = list(api.client().chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    assert _forced(chunks[-1].usage) == _forced(whole.usage) > 0
    jsonschema.validate(json.loads(whole.choices[0].message.content), ORDER)


def test_responses_text_format_is_jumped_and_counted(api):
    r = api.client().responses.create(model=api.model, input=PROMPT, max_output_tokens=120, temperature=0,
                                      text={"format": {"type": "json_schema", "name": "order", "schema": ORDER}})
    jsonschema.validate(json.loads(r.output_text), ORDER)
    assert (r.usage.output_tokens_details.model_extra or {}).get("forced_tokens", 0) > 0
