"""Sliding-window layers keep K/V only where a window still reads it (runtime/kv_manager.py, radix/
window_pages.py): their own pool, smaller than the KV pool, pages given back as windows pass them,
cached pages tombstoned under pressure. Greedy text stays transformers' own with the window pool at
its smallest, with and without the radix cache, at page sizes 1 and 4, and after a prefix hit."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.api.shell.metrics import ServerMetrics
from radixserve.radix import WindowPages
from radixserve.runtime.config import EngineConfig
from radixserve.runtime.engine import Engine
from radixserve.runtime.kv_cache import KVCache, KVLayers, kv_cache_tokens, window_tokens
from radixserve.runtime.models.loader import load_model_files
from radixserve.runtime.sampling_params import SamplingParams
from .schedule_sim import SimEngine
from .test_model_families import NEW_TOKENS, PROMPTS, hf_greedy
from .tiny_models import build_tiny_model

GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module", params=["gemma3", "gpt_oss"])
def family(request, tmp_path_factory, default_model_files):
    directory = tmp_path_factory.mktemp(request.param)
    hf = build_tiny_model(request.param, directory, default_model_files.tokenizer)
    return load_model_files(str(directory)), [hf_greedy(hf, p) for p in PROMPTS]


@pytest.mark.parametrize("backend", ["cpu", "torch"])
@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("radix", [True, False])
def test_smallest_window_pool_keeps_transformers_greedy_text(family, make_engine, page_size, radix, backend):
    files, expected = family
    engine = make_engine(files, page_size=page_size, chunked_prefill_size=5, kv_cache_tokens=1024,
                         swa_full_tokens_ratio=0.001, disable_radix_cache=not radix, attention_backend=backend)
    assert engine.windows.num_pages * page_size < 1024 // 8
    engine.generate(PROMPTS[0], GREEDY)
    assert [r.token_ids for r in engine.generate(PROMPTS, GREEDY)] == expected
    engine.check_idle_invariant()


def test_window_layers_take_a_pool_of_their_own_smaller_than_the_kv_pool(family, make_engine):
    files, _ = family
    engine = make_engine(files, kv_cache_tokens=1024, page_size=4, chunked_prefill_size=8, swa_full_tokens_ratio=0.25)
    kv, windowed = engine.kv_cache, [files.config.window(i) is not None for i in range(files.config.num_layers)]
    assert kv.full.k.shape[:2] == (windowed.count(False), 1024 // 4 + 1)
    assert kv.windowed.k.shape[:2] == (windowed.count(True), 256 // 4 + 1)


def test_a_window_pool_never_holds_less_than_one_requests_window_and_chunk(family, make_engine):
    files, _ = family
    engine = make_engine(files, kv_cache_tokens=1024, page_size=4, chunked_prefill_size=8, swa_full_tokens_ratio=0.001)
    assert engine.windows.num_pages * 4 >= files.config.sliding_window + 8 + 2 * 4


def test_a_restarted_engine_reads_a_windowed_prefix_back_from_disk_with_the_same_text(family, make_engine, tmp_path):
    files, expected = family
    config = dict(dtype="float32", page_size=4, chunked_prefill_size=5, kv_cache_tokens=1024,
                  max_running_requests=16, swa_full_tokens_ratio=0.001, cache_dir=str(tmp_path))
    first = Engine(EngineConfig(**config), model_files=files)
    try:
        assert first.generate(PROMPTS[0], GREEDY)[0].token_ids == expected[0]
    finally:
        first.shutdown()
    again = make_engine(files, **config)
    results = again.generate(PROMPTS, GREEDY)
    assert [r.token_ids for r in results] == expected
    assert again.stats().prefix_cache_disk_hit_tokens >= len(PROMPTS[0]) // 4 * 4 - 4


SYSTEMS = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [1, 2, 3, 4, 50, 60, 70], [90, 91, 92, 93, 94, 95, 96, 97]]


@settings(max_examples=300, deadline=None)
@given(page_size=st.sampled_from([1, 2, 4]), window=st.integers(1, 12), spare=st.integers(0, 24),
       radix=st.booleans(), kv_tokens=st.integers(40, 96), chunk=st.integers(3, 9),
       prompts=st.lists(st.tuples(st.integers(0, 2), st.lists(st.integers(100, 104), max_size=12),
                                  st.integers(1, 12)), min_size=1, max_size=10))
def test_every_read_finds_its_own_prefix_under_any_window_pool(page_size, window, spare, radix, kv_tokens, chunk,
                                                              prompts):
    """Against a naive reference (what each slot was last computed from), through the real scheduler:
    every position a step reads, globally or through a window, holds the request's own prefix,
    whatever the pool sizes, evictions, tombstones, truncated hits and preemptions in between."""
    # (any prompt and its output fit the KV pool, as submit demands)
    sim = SimEngine(kv_cache_tokens=kv_tokens - kv_tokens % page_size, page_size=page_size, window=window,
                    window_tokens=window + chunk + 2 * page_size + spare, chunked_prefill_size=chunk,
                    max_batched_tokens=16, max_running_requests=4, disable_radix_cache=not radix, max_context=64)
    for system, tail, max_tokens in prompts:
        sim.submit(SYSTEMS[system] + tail, max_tokens=max_tokens)
    sim.run(max_steps=2000)
    assert len(sim.finished) == len(prompts)
    sim.kv.flush()
    assert sim.kv.pool.num_free == sim.kv.pool.num_pages
    assert sim.kv.windows.num_free == sim.kv.windows.num_pages


def test_without_hybrid_swa_memory_every_layer_keeps_every_position(family, make_engine):
    files, expected = family
    engine = make_engine(files, page_size=4, chunked_prefill_size=5, kv_cache_tokens=1024,
                         disable_hybrid_swa_memory=True)
    assert engine.windows is None and engine.kv_cache.windowed is None
    assert engine.kv_cache.full.k.shape[0] == files.config.num_layers
    assert [r.token_ids for r in engine.generate(PROMPTS, GREEDY)] == expected


def test_metrics_count_the_window_pages_attached_and_free(family, make_engine):
    files, _ = family
    engine = make_engine(files, page_size=4, chunked_prefill_size=5, kv_cache_tokens=1024, swa_full_tokens_ratio=0.25)
    metrics = ServerMetrics(lambda: engine)
    stream = engine.submit(PROMPTS[0], GREEDY)
    stream.wait_finished()
    attached = engine.windows.num_pages - engine.windows.num_free
    assert attached > 0   # the prompt's cached pages keep theirs while nothing needs them
    text = metrics.exposition()[0].decode()
    assert f'radixserve_kv_window_pages{{state="attached"}} {float(attached)}' in text
    assert f'radixserve_kv_window_pages{{state="free"}} {float(engine.windows.num_free)}' in text


@pytest.mark.parametrize("ratio", [0.0, -0.5, 1.5])
def test_a_window_pool_share_outside_zero_to_one_is_refused(ratio):
    with pytest.raises(ValueError, match="swa-full-tokens-ratio"):
        EngineConfig(swa_full_tokens_ratio=ratio).validate()


def test_a_prompt_cached_in_one_chunk_keeps_the_window_pages_a_later_hit_needs(family, make_engine):
    """Pages cached as their chunk lands keep their window pages until the pool runs short, even those
    the chunk's own window has passed: a request sharing the prompt's start reads them."""
    files, expected = family
    engine = make_engine(files, page_size=1, chunked_prefill_size=64, kv_cache_tokens=1024, swa_full_tokens_ratio=1.0)
    engine.generate(PROMPTS[0], GREEDY)
    [second] = engine.generate([PROMPTS[1]], GREEDY)
    assert second.cached_tokens == len(PROMPTS[0]) - 1 and second.token_ids == expected[1]


def test_the_device_map_follows_the_host_map_through_uploads():
    windows = WindowPages(8, 4, 2)
    windows.map, windows._dirty = windows.map.clone(), []   # as on a GPU: a copy, sent on upload
    send = lambda values, dtype: torch.tensor(values, dtype=dtype)  # noqa: E731
    windows.attach([1, 5, 6])
    windows.upload(send)
    windows.detach([5])
    windows.move(6, 2)
    windows.upload(send)
    assert windows.map.tolist() == windows.host_map().tolist()
    assert windows.map[[1, 2, 5, 6, 8]].tolist()[2:] == [4, 4, 4]   # none, none, and the KV padding page


def test_a_prefix_read_back_from_disk_takes_window_pages_from_older_cached_ones(family, make_engine, tmp_path):
    """The window pool is full of later prompts' cached window pages when an evicted prompt comes
    back from disk: the least recently used of them give theirs up, and the prompt is a hit."""
    files, expected = family
    engine = make_engine(files, page_size=1, chunked_prefill_size=16, kv_cache_tokens=256,
                         swa_full_tokens_ratio=0.001, cache_dir=str(tmp_path))
    engine.generate(PROMPTS[0], GREEDY)
    for i in range(12):   # distinct prompts: the first one leaves the tree for the disk
        engine.generate([5000 + 50 * i + j for j in range(15)], GREEDY)
    assert engine.kv.evicted_tokens > 0 and engine.windows.num_free < files.config.sliding_window
    [again] = engine.generate([PROMPTS[0]], GREEDY)
    hit = len(PROMPTS[0]) - 1
    assert again.token_ids == expected[0]
    assert again.cached_tokens == hit and engine.stats().prefix_cache_disk_hit_tokens == hit


def test_cached_pages_that_gave_their_window_pages_back_take_them_again_from_disk(family, make_engine, tmp_path):
    """A prompt still in the tree, its window pages taken by later prompts: its window's pages are
    filled again from their whole copies on disk, not recomputed."""
    files, expected = family
    engine = make_engine(files, page_size=1, chunked_prefill_size=16, kv_cache_tokens=2048,
                         swa_full_tokens_ratio=0.001, cache_dir=str(tmp_path))
    engine.generate(PROMPTS[0], GREEDY)
    for i in range(8):   # later prompts take the window pages; the pool keeps every page
        engine.generate([5000 + 50 * i + j for j in range(15)], GREEDY)
    assert engine.kv.evicted_tokens == 0
    [again] = engine.generate([PROMPTS[0]], GREEDY)
    assert again.token_ids == expected[0]
    assert again.cached_tokens == len(PROMPTS[0]) - 1
    assert 0 < engine.stats().prefix_cache_disk_hit_tokens <= len(PROMPTS[0]) - 1


@pytest.mark.parametrize("ratio", [0.001, 0.5])
def test_the_window_pool_and_the_kv_pool_fit_the_memory_share_together(family, ratio):
    files, _ = family
    mc, p = files.config, 4
    config = EngineConfig(page_size=p, chunked_prefill_size=64, mem_fraction=0.5, swa_full_tokens_ratio=ratio)
    free = 8 << 20
    tokens = kv_cache_tokens(config, mc, torch.float32, free)
    windows = window_tokens(config, mc, tokens)
    kv = KVLayers.of(mc, tokens // p, windows // p, p, torch.float32, torch.device("cpu"))
    size = sum(2 * c.k[:, :-1].numel() * c.k.element_size() for c in (kv.full, kv.windowed))   # less padding pages
    page = KVCache.bytes_per_token(mc.num_layers, mc.num_kv_heads, mc.head_dim, torch.float32) * p
    assert free * 0.5 - 2 * page <= size <= free * 0.5
