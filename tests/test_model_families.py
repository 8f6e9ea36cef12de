"""Each newer family served end to end: greedy text of a batch of four prompts that share a prefix,
prefilled in small chunks over the radix cache, equals transformers' own greedy text of each.

(Logits parity, prefill and decode, is tests/test_model_parity.py.)
"""
from __future__ import annotations

import pytest
import torch

from radixserve.runtime.models.loader import load_model_files
from radixserve.runtime.sampling_params import SamplingParams
from .tiny_models import build_tiny_model

NEW_TOKENS = 16
SHARED = [5, 17, 923, 4000, 12, 88, 3021, 7, 7, 101, 4522, 39, 640, 2048]
PROMPTS = [SHARED + tail for tail in ([11], [300, 301], [9, 9, 9], [4444])]


def hf_greedy(model, prompt: list[int]) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, min_new_tokens=NEW_TOKENS)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("arch", ["phi3", "phi4_mini", "mixtral", "qwen3_moe", "gemma3", "gpt_oss"])
def test_batch_with_shared_prefix_and_chunked_prefill_equals_transformers_greedy(arch, make_engine, tmp_path,
                                                                                   default_tokenizer):
    hf = build_tiny_model(arch, tmp_path / arch, default_tokenizer)
    expected = [hf_greedy(hf, p) for p in PROMPTS]
    engine = make_engine(load_model_files(str(tmp_path / arch)), page_size=4, chunked_prefill_size=5,
                         kv_cache_tokens=1024)
    greedy = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    engine.generate(PROMPTS[0], greedy)   # the shared prefix is cached before the batch comes
    assert [r.token_ids for r in engine.generate(PROMPTS, greedy)] == expected


@pytest.mark.parametrize("arch", ["phi4_mini", "mixtral", "gemma3", "gpt_oss"])
def test_each_family_serves_in_bfloat16(arch, make_engine, tmp_path, default_tokenizer):
    """The CPU's default dtype for a Hugging Face model where the CPU has bf16: every layer's output
    meets the fused norm kernels in the dtype they take."""
    build_tiny_model(arch, tmp_path / arch, default_tokenizer)
    engine = make_engine(load_model_files(str(tmp_path / arch)), dtype="bfloat16", kv_cache_tokens=1024)
    greedy = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    [out] = engine.generate([PROMPTS[0]], greedy)
    assert len(out.token_ids) == NEW_TOKENS and out.finish_reason == "length"
