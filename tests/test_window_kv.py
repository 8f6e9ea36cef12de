"""Sliding-window layers keep K/V only where a window still reads it (runtime/kv_manager.py, radix/
window_pages.py): their own pool, smaller than the KV pool, pages given back as windows pass them,
cached pages tombstoned under pressure. Greedy text stays transformers' own with the window pool at
its smallest, with and without the radix cache, at page sizes 1 and 4, and after a prefix hit."""
from __future__ import annotations

import pytest

from radixserve.runtime.models.loader import load_model_files
from radixserve.runtime.sampling_params import SamplingParams
from .test_model_families import NEW_TOKENS, PROMPTS, hf_greedy
from .tiny_models import build_tiny_model

GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module", params=["gemma3", "gpt_oss"])
def family(request, tmp_path_factory, default_model_files):
    directory = tmp_path_factory.mktemp(request.param)
    hf = build_tiny_model(request.param, directory, default_model_files.tokenizer)
    return load_model_files(str(directory)), [hf_greedy(hf, p) for p in PROMPTS]


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("radix", [True, False])
def test_smallest_window_pool_keeps_transformers_greedy_text(family, make_engine, page_size, radix):
    files, expected = family
    engine = make_engine(files, page_size=page_size, chunked_prefill_size=5, kv_cache_tokens=1024,
                         swa_full_tokens_ratio=0.001, disable_radix_cache=not radix)
    assert engine.windows.num_pages * page_size < 1024 // 8
    engine.generate(PROMPTS[0], GREEDY)
    assert [r.token_ids for r in engine.generate(PROMPTS, GREEDY)] == expected
    engine.check_idle_invariant()
