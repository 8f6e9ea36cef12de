"""Engine behaviour on the real default model: answers, streaming, stops, aborts, limits."""
from __future__ import annotations

import asyncio
import threading

import pytest

from radixserve.runtime.engine import collect
from radixserve.runtime.engine_client import EngineRefusal, RefusalKind
from radixserve.runtime.sampling_params import SamplingParams


def chat(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": text}]))


def greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, **kw)


def test_answers_capital_of_france_with_paris(make_engine, default_tokenizer):
    engine = make_engine(dtype="auto")  # the configuration users get
    # The bare question puts "The" and "L" 0.08 logits apart even in float32: bf16 hosts (AMX)
    # flip that tie. Asked for a sentence, the first token wins by ~1.4 logits on every dtype.
    out = engine.generate(chat(default_tokenizer, "What is the capital of France? Answer in one sentence."),
                          greedy(32))[0]
    assert "Paris" in out.text
    assert out.finish_reason == "stop"


def test_request_joining_mid_generation_matches_running_alone(make_engine, default_tokenizer):
    engine = make_engine()
    a, b = chat(default_tokenizer, "Write a haiku about rain."), chat(default_tokenizer, "Name three rivers.")
    alone_a = engine.generate(a, greedy(40, ignore_eos=True))[0].token_ids
    alone_b = engine.generate(b, greedy(24, ignore_eos=True))[0].token_ids
    engine.flush_cache()
    stream_a = engine.submit(a, greedy(40, ignore_eos=True))
    seen = []
    for out in stream_a:
        seen.extend(out.token_ids)
        if len(seen) == 10:  # a is decoding; b joins the running batch now
            stream_b = engine.submit(b, greedy(24, ignore_eos=True))
            break
    seen.extend(collect(stream_a).token_ids)
    assert seen == alone_a
    assert collect(stream_b).token_ids == alone_b


def test_abort_mid_generation_ends_stream_with_abort(make_engine, default_tokenizer):
    engine = make_engine()
    stream = engine.submit(chat(default_tokenizer, "Tell me a long story."), greedy(400, ignore_eos=True),
                           request_id="long")
    outs = []
    for out in stream:
        outs.append(out)
        if len(outs) == 5:
            engine.abort("long")
    assert outs[-1].finish_reason == "abort"
    assert outs[-1].completion_tokens < 400


def test_async_stream_yields_the_same_text(make_engine, default_tokenizer):
    engine = make_engine()
    ids = chat(default_tokenizer, "Say hello.")
    expected = engine.generate(ids, greedy(16))[0].text

    async def run():
        return "".join([o.text async for o in engine.submit(ids, greedy(16))])

    assert asyncio.run(run()) == expected


def test_stop_string_spanning_tokens_ends_output_before_it(make_engine, default_tokenizer):
    engine = make_engine()
    ids = chat(default_tokenizer, "What is the capital of France?")
    full = engine.generate(ids, greedy(32))[0].text  # "The capital of France is Paris."
    stop = "of Fra"                                    # spans "of", " France"
    assert stop in full
    streamed = [o for o in engine.submit(ids, greedy(32, stop=[stop]))]
    text = "".join(o.text for o in streamed)
    assert text == full[: full.index(stop)]
    assert streamed[-1].finish_reason == "stop"


def test_partial_stop_match_is_released_when_it_stops_matching(make_engine, default_tokenizer):
    engine = make_engine()
    ids = chat(default_tokenizer, "What is the capital of France?")
    full = engine.generate(ids, greedy(32))[0].text
    text = engine.generate(ids, greedy(32, stop=["of Germany"]))[0].text
    assert text == full


def test_multibyte_text_streams_without_broken_characters(make_engine, default_tokenizer):
    engine = make_engine()
    ids = default_tokenizer.encode("Übersetze ins Japanische und Emoji: こんにちは 🌍🎉 → ")
    chunks = [o.text for o in engine.submit(ids, SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True))]
    assert all("\ufffd" not in c for c in chunks)
    whole = "".join(chunks)
    assert whole == engine.generate(ids, greedy(40, ignore_eos=True))[0].text


def test_emoji_split_across_tokens_is_emitted_whole(make_engine, default_tokenizer):
    # a prompt that makes the model repeat emojis (each is several byte-level tokens)
    engine = make_engine()
    ids = default_tokenizer.encode("🌍🌍🌍🌍🌍🌍🌍🌍🌍🌍🌍🌍")
    outs = list(engine.submit(ids, greedy(12, ignore_eos=True)))
    assert sum(len(o.token_ids) for o in outs) == 12
    for o in outs:
        assert "\ufffd" not in o.text
    assert "🌍" in "".join(o.text for o in outs)


def test_min_tokens_holds_back_eos(make_engine, default_tokenizer):
    engine = make_engine()
    ids = chat(default_tokenizer, "What is the capital of France?")
    short = engine.generate(ids, greedy(64))[0]
    assert short.finish_reason == "stop"
    n = len(short.token_ids)
    longer = engine.generate(ids, greedy(64, min_tokens=n + 5))[0]
    assert len(longer.token_ids) >= n + 5


def test_ignore_eos_runs_to_max_tokens(make_engine, default_tokenizer):
    engine = make_engine()
    out = engine.generate(chat(default_tokenizer, "What is the capital of France?"), greedy(30, ignore_eos=True))[0]
    assert len(out.token_ids) == 30 and out.finish_reason == "length"


def test_stop_token_ids_end_generation(make_engine, default_tokenizer):
    engine = make_engine()
    ids = chat(default_tokenizer, "What is the capital of France?")
    full = engine.generate(ids, greedy(32))[0]
    stop_id = full.token_ids[3]
    out = engine.generate(ids, greedy(32, stop_token_ids=[stop_id]))[0]
    assert out.token_ids == full.token_ids[:4] and out.finish_reason == "stop"


def test_same_seed_gives_same_sample_whatever_the_batch(make_engine, default_tokenizer):
    engine = make_engine()
    ids = chat(default_tokenizer, "Invent a name for a cat.")
    params = SamplingParams(max_tokens=20, temperature=1.0, top_p=0.95, seed=1234, ignore_eos=True)
    alone = engine.generate(ids, params)[0].token_ids
    others = [chat(default_tokenizer, f"Count to {i}.") for i in range(5)]
    mixed = engine.generate(others + [ids], [SamplingParams(max_tokens=20, temperature=1.0)] * 5 + [params])
    assert mixed[-1].token_ids == alone
    other_seed = engine.generate(ids, SamplingParams(max_tokens=20, temperature=1.0, top_p=0.95, seed=99,
                                                     ignore_eos=True))[0].token_ids
    assert other_seed != alone


def test_cached_tokens_reported_for_a_repeated_prompt(make_engine, default_tokenizer):
    engine = make_engine(page_size=16)
    ids = chat(default_tokenizer, "Summarise the plot of Hamlet in one sentence. " * 4)
    first = engine.generate(ids, greedy(4))[0]
    second = engine.generate(ids, greedy(4))[0]
    assert first.cached_tokens == 0
    assert second.cached_tokens == (len(ids) - 1) // 16 * 16


def test_prompt_in_flight_is_reused_by_a_second_request(make_engine, default_tokenizer):
    # chunked prefill inserts each finished chunk into the tree
    engine = make_engine(page_size=1, chunked_prefill_size=16, max_batched_tokens=16)
    ids = chat(default_tokenizer, "Describe the water cycle in detail. " * 6)
    s1 = engine.submit(ids, greedy(2))
    s2 = engine.submit(ids, greedy(2))
    r1, r2 = collect(s1), collect(s2)
    assert r1.token_ids == r2.token_ids
    assert r2.cached_tokens > 0


def test_logprobs_report_sampled_token_and_alternatives(make_engine, default_tokenizer):
    engine = make_engine()
    out = engine.generate(chat(default_tokenizer, "Say yes."), greedy(5, logprobs=3))[0]
    assert len(out.logprobs) == len(out.token_ids)
    for tok, lp in zip(out.token_ids, out.logprobs):
        assert lp.token_id == tok and lp.logprob <= 0
        assert len(lp.top) == 3 and lp.top[0][0] == tok  # greedy: the best alternative is the token


def test_preemption_under_memory_pressure_keeps_outputs(make_engine, default_tokenizer):
    prompts = [chat(default_tokenizer, f"List facts about the number {i}.") for i in range(6)]
    roomy = make_engine(page_size=1)
    expected = [r.token_ids for r in roomy.generate(prompts, greedy(40, ignore_eos=True))]
    tight = make_engine(page_size=1, kv_cache_tokens=260)  # fits ~4 of them at full length
    got = [r.token_ids for r in tight.generate(prompts, greedy(40, ignore_eos=True))]
    assert got == expected
    assert tight.scheduler.stats.preemptions > 0


def test_many_threads_submitting_at_once(make_engine, default_tokenizer):
    engine = make_engine()
    ids = chat(default_tokenizer, "Name a colour.")
    expected = engine.generate(ids, greedy(8))[0].token_ids
    results = [None] * 8

    def worker(i):
        results[i] = collect(engine.submit(ids, greedy(8))).token_ids

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == [expected] * 8


# ---- bad input: rejected at submit with the field named ---------------------------------------

@pytest.mark.parametrize("field,value", [
    ("max_tokens", 0), ("temperature", -1.0), ("top_p", 0.0), ("top_k", -5), ("min_p", 2.0),
    ("frequency_penalty", 3.0), ("presence_penalty", -3.0), ("repetition_penalty", 0.0),
    ("logprobs", 50), ("stop_token_ids", [10 ** 9]), ("min_tokens", 999), ("stop", [""]),
])
def test_invalid_sampling_value_names_the_field(make_engine, field, value):
    engine = make_engine()
    with pytest.raises(EngineRefusal) as refused:
        engine.submit([1, 2, 3], SamplingParams(**{field: value}))
    assert (refused.value.kind, refused.value.field) == (RefusalKind.INVALID, field)


def test_prompt_longer_than_context_is_rejected(make_engine):
    engine = make_engine()
    ctx = engine.model_config.max_context_len
    with pytest.raises(EngineRefusal, match="prompt") as refused:
        engine.submit([5] * ctx, SamplingParams(max_tokens=1))
    assert (refused.value.kind, refused.value.field) == (RefusalKind.CONTEXT_LENGTH, "prompt")


def test_max_tokens_beyond_context_is_rejected(make_engine):
    engine = make_engine()
    with pytest.raises(EngineRefusal, match="max_tokens") as refused:
        engine.submit([5] * 10, SamplingParams(max_tokens=engine.model_config.max_context_len))
    assert refused.value.kind is RefusalKind.CONTEXT_LENGTH


def test_empty_prompt_is_rejected(make_engine):
    engine = make_engine()
    with pytest.raises(EngineRefusal) as refused:
        engine.submit([], SamplingParams())
    assert (refused.value.kind, refused.value.field) == (RefusalKind.INVALID, "prompt")


def test_final_output_reports_time_to_first_token(make_engine):
    engine = make_engine()
    outputs = list(engine.submit("Once upon a time", SamplingParams(max_tokens=3, temperature=0.0)))
    assert outputs[-1].time_to_first_token is not None and outputs[-1].time_to_first_token > 0
    assert all(o.time_to_first_token is None for o in outputs[:-1])


def test_shutdown_ends_every_submitted_stream(default_model_files):
    from radixserve.runtime.config import EngineConfig
    from radixserve.runtime.engine import Engine

    engine = Engine(EngineConfig(dtype="float32", kv_cache_tokens=4096, max_running_requests=2),
                    model_files=default_model_files)
    # more requests than can run: some are running, some waiting, some maybe still in the inbox
    streams = [engine.submit(f"Story number {i}:", SamplingParams(max_tokens=200, ignore_eos=True))
               for i in range(6)]
    engine.shutdown()
    for stream in streams:
        finals: list = []
        reader = threading.Thread(target=lambda s=stream: finals.append(s.wait_finished()[-1]), daemon=True)
        reader.start()
        reader.join(timeout=10)
        assert finals and finals[0].finish_reason == "abort", "a stream never got its final output"
    engine.kv.check_invariant([])
    with pytest.raises(EngineRefusal, match="shut down") as refused:
        engine.submit("more", SamplingParams(max_tokens=1))
    assert refused.value.kind is RefusalKind.STOPPED
