"""Greedy output of the real default model is the same whatever the batching and caching do.

float32, so that the only differences are summation order; 8 prompts sharing long prefixes.
"""
from __future__ import annotations

import pytest

from radixserve.runtime.sampling_params import SamplingParams

SYSTEM = ("You are a meticulous assistant for a travel agency. Answer in one short paragraph, "
          "name concrete places, and never invent prices. ")
QUESTIONS = ["Where should I go in Portugal in May?", "What is a good day trip from Kyoto?",
             "Which Greek island is quiet in October?", "Plan one evening in Vienna.",
             "Is Iceland worth visiting in winter?", "Best museum in Madrid for a rainy day?",
             "Where can I hike near Vancouver?", "Suggest a food market in Istanbul."]
NEW_TOKENS = 48
GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def prompts(default_tokenizer):
    chats = [default_tokenizer.apply_chat_template([{"role": "system", "content": SYSTEM * 2},
                                                   {"role": "user", "content": q}]) for q in QUESTIONS]
    # two of them share an even longer prefix
    chats[1] = chats[0] + " Also, " + QUESTIONS[1]
    return [default_tokenizer.encode(c) for c in chats]


@pytest.fixture(scope="module")
def reference(prompts, default_model_files):
    """One request at a time, radix cache off, no chunking, page size 1."""
    from .conftest import assert_all_pages_free
    from radixserve.runtime.config import EngineConfig
    from radixserve.runtime.engine import Engine

    engine = Engine(EngineConfig(dtype="float32", kv_cache_tokens=4096, page_size=1, disable_radix_cache=True,
                                 chunked_prefill_size=4096, max_batched_tokens=4096),
                    model_files=default_model_files)
    try:
        outs = [engine.generate(p, GREEDY)[0].token_ids for p in prompts]
        assert_all_pages_free(engine)
    finally:
        engine.shutdown()
    assert all(len(o) == NEW_TOKENS for o in outs)
    return outs


def batched(engine, prompts):
    return [r.token_ids for r in engine.generate(prompts, GREEDY)]


@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_batched_equals_one_by_one(make_engine, prompts, reference, backend):
    engine = make_engine(page_size=1, disable_radix_cache=True, attention_backend=backend)
    assert batched(engine, prompts) == reference


def test_radix_cache_on_equals_off(make_engine, prompts, reference):
    engine = make_engine(page_size=1)
    first = batched(engine, prompts)
    second = batched(engine, prompts)   # now mostly served from the tree
    assert first == reference and second == reference


def test_chunked_prefill_of_seven_tokens_equals_unchunked(make_engine, prompts, reference):
    engine = make_engine(page_size=1, chunked_prefill_size=7, max_batched_tokens=64)
    assert batched(engine, prompts) == reference


def test_page_size_16_equals_page_size_1(make_engine, prompts, reference):
    engine = make_engine(page_size=16)
    assert batched(engine, prompts) == reference
    assert batched(engine, prompts) == reference


def assert_staggered_decodes_on_a_cached_prefix_equal_one_by_one(engine, prompts, reference) -> None:
    batched(engine, prompts[:1])        # caches the system prompt
    # requests end at different steps, so the groups change; the last two share a longer prefix
    lengths = [NEW_TOKENS, NEW_TOKENS] + [12 + 4 * i for i in range(len(prompts) - 2)]
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in lengths]
    outs = [r.token_ids for r in engine.generate(prompts, params)]
    assert outs == [ref[:n] for ref, n in zip(reference, lengths)]


def test_torch_decoding_against_a_shared_cached_prefix_equals_one_by_one(make_engine, prompts, reference,
                                                                        monkeypatch):
    # the prompts share ~60 tokens: too few for the torch backend's thresholds, so they are lowered
    # to make every group with a shared page attend to it once
    import radixserve.runtime.attention_torch as attention_torch
    monkeypatch.setattr(attention_torch, "MIN_SHARED_DECODE_SAVING", 1)
    monkeypatch.setattr(attention_torch, "MIN_GROUP_SAVING", 1)
    shared_groups = []
    make_groups = attention_torch.shared_prefix_groups

    def recording_groups(reqs, page_size):
        groups = make_groups(reqs, page_size)
        shared_groups.extend(groups)
        return groups

    monkeypatch.setattr(attention_torch, "shared_prefix_groups", recording_groups)
    kept_layers = []   # layers whose gathered prefix K/V each step found kept from the step before
    of_groups = attention_torch.SharedPrefixes.of_groups
    def recording_of_groups(*args, layer_kv):
        kept_layers.append(len(layer_kv))
        return of_groups(*args, layer_kv=layer_kv)

    monkeypatch.setattr(attention_torch.SharedPrefixes, "of_groups", staticmethod(recording_of_groups))
    engine = make_engine(page_size=4, attention_backend="torch")
    assert_staggered_decodes_on_a_cached_prefix_equal_one_by_one(engine, prompts, reference)
    assert len({tuple(members) for members, _ in shared_groups}) > 1, "the groups never changed"
    assert max(kept_layers) == engine.model_config.num_layers, "no step reused the last step's prefix K/V"


def test_cpu_decoding_against_a_shared_cached_prefix_equals_one_by_one(make_engine, prompts, reference,
                                                                      monkeypatch):
    import radixserve.runtime.attention_cpu as attention_cpu
    plans = []   # the groups of each step's decode plan
    plan_of = attention_cpu.DecodePlan.of

    def recording_plan(page_rows, lens, groups, heads, dim, window=None):
        plans.append([tuple(rows) for rows, _ in groups])
        return plan_of(page_rows, lens, groups, heads, dim, window)

    monkeypatch.setattr(attention_cpu.DecodePlan, "of", staticmethod(recording_plan))
    engine = make_engine(page_size=4, attention_backend="cpu")
    assert_staggered_decodes_on_a_cached_prefix_equal_one_by_one(engine, prompts, reference)
    assert len({g for groups in plans for g in groups}) > 1, "no decode step shared a prefix, or the groups never changed"


def test_prefills_after_one_cached_prefix_scored_together_equal_one_by_one(make_engine, prompts, reference,
                                                                          monkeypatch):
    import radixserve.runtime.attention_torch as attention_torch
    together = []   # segments per scored extend call
    make_context = attention_torch.extend_context

    def recording_context(prefix_slots, new_slots, kv_heads, heads):
        together.append(len(new_slots))
        return make_context(prefix_slots, new_slots, kv_heads, heads)

    monkeypatch.setattr(attention_torch, "extend_context", recording_context)
    engine = make_engine()
    batched(engine, prompts[:1])        # caches the system prompt
    assert batched(engine, prompts) == reference
    assert max(together) > 1, "no step scored several prefills after one cached prefix together"
