"""Our forward (prefill, then step-by-step decode over the paged cache) against transformers.

Tolerance: float32 on both sides; absolute logit difference below 2e-4 (logits here are O(1)-O(10),
the gap comes from summation order in fused vs separate projections and attention kernels).
"""
from __future__ import annotations

import pytest
import torch

from radixserve.kernels.paged_attention import attention_bias, decode_kv_rows
from radixserve.runtime.attention import TorchAttentionBackend
from radixserve.runtime.forward_batch import ExtendSegment, ForwardBatch
from radixserve.runtime.kv_cache import KVCache
from radixserve.runtime.models.llama import LlamaForCausalLM
from radixserve.runtime.models.loader import load_model_files
from .tiny_models import build_tiny_model

ATOL = 2e-4
PROMPT = [5, 17, 923, 4000, 12, 88, 3021, 7, 7, 101, 4522, 39]
DECODE_STEPS = 6


def our_logits(model_path, ids: list[int], page_size: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Prefill logits for every prompt position, then one logits row per decoded (given) token."""
    files = load_model_files(str(model_path))
    cfg = files.config
    model = LlamaForCausalLM(cfg, files.weights, torch.float32, torch.device("cpu"))
    pages = 32
    kv = KVCache(cfg.num_layers, pages, page_size, cfg.num_kv_heads, cfg.head_dim, torch.float32, torch.device("cpu"))
    attn = TorchAttentionBackend(kv, cfg.head_dim)
    # pages in reverse order so that positions do not map to slots trivially
    order = list(range(pages - 1, -1, -1))
    slot = lambda pos: order[pos // page_size] * page_size + pos % page_size  # noqa: E731
    n = len(PROMPT)
    prefill = ForwardBatch(
        input_ids=torch.tensor(ids[:n]), positions=torch.arange(n), out_slots=torch.tensor([slot(i) for i in range(n)]),
        num_decode=0, extends=[ExtendSegment(0, n, 0, None)])
    first = model.forward(prefill, attn)
    steps = []
    for pos in range(n, len(ids)):
        n_pages = pos // page_size + 1
        attend = (torch.arange(n_pages * page_size) <= pos)[None, None, None, :]
        step = ForwardBatch(
            input_ids=torch.tensor([ids[pos]]), positions=torch.tensor([pos]), out_slots=torch.tensor([slot(pos)]),
            num_decode=1, decode_kv_rows=decode_kv_rows(torch.tensor([order[:n_pages]]), page_size, cfg.num_kv_heads),
            decode_bias=attention_bias(attend))
        steps.append(model.forward(step, attn)[0])
    return first, steps


def hf_logits(hf_model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([ids])).logits[0].float()


def hf_greedy(hf_model, steps: int) -> list[int]:
    ids = list(PROMPT)
    for _ in range(steps):
        ids.append(int(hf_logits(hf_model, ids)[-1].argmax()))
    return ids


@pytest.mark.parametrize("arch", ["llama", "llama_tied", "qwen2", "qwen3"])
@pytest.mark.parametrize("page_size", [1, 4])
def test_prefill_and_decode_logits_match_transformers(arch, page_size, tmp_path, default_tokenizer):
    hf = build_tiny_model(arch, tmp_path / arch, default_tokenizer)
    ids = hf_greedy(hf, DECODE_STEPS)
    ref = hf_logits(hf, ids)
    prefill, steps = our_logits(tmp_path / arch, ids, page_size)
    n = len(PROMPT)
    torch.testing.assert_close(prefill, ref[:n], atol=ATOL, rtol=0)
    for i, row in enumerate(steps):
        torch.testing.assert_close(row, ref[n + i], atol=ATOL, rtol=0)


def test_gguf_export_of_a_tiny_llama_matches_transformers(tmp_path, default_model_files):
    """A GGUF written the way llama.cpp's converter writes it (q/k rows permuted for its RoPE)."""
    from .gguf_export import write_llama_gguf

    hf = build_tiny_model("llama_tied", tmp_path / "hf", default_model_files.tokenizer, seed=3)
    path = write_llama_gguf(hf, tmp_path / "tiny.gguf", default_model_files)
    ids = hf_greedy(hf, DECODE_STEPS)
    ref = hf_logits(hf, ids)
    prefill, steps = our_logits(path, ids, page_size=1)
    torch.testing.assert_close(prefill, ref[: len(PROMPT)], atol=ATOL, rtol=0)
    torch.testing.assert_close(torch.stack(steps), ref[len(PROMPT):], atol=ATOL, rtol=0)
