"""Our forward (prefill, then step-by-step decode over the paged cache) against transformers.

Tolerance: float32 on both sides; absolute logit difference below 2e-4 (logits here are O(1)-O(10),
the gap comes from summation order in fused vs separate projections and attention kernels).
"""
from __future__ import annotations

import pytest
import torch

from radixserve.runtime.attention import make_attention_backend
from radixserve.runtime.forward_batch import BatchLayout, ForwardBatch
from radixserve.runtime.kv_cache import KVCache
from radixserve.runtime.models.llama import LlamaForCausalLM
from radixserve.runtime.models.loader import load_model_files
from radixserve.runtime.platform import get_platform
from .tiny_models import build_tiny_model

ATOL = 2e-4
PROMPT = [5, 17, 923, 4000, 12, 88, 3021, 7, 7, 101, 4522, 39]
DECODE_STEPS = 6


def our_logits(model_path, ids: list[int], page_size: int, dequantize: bool = False, attention: str = "torch"
               ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Prefill logits for every prompt position, then one logits row per decoded (given) token (a
    GGUF's block matrices on the block kernels, or with `dequantize` as float32 weights), on the
    `attention` backend."""
    files = load_model_files(str(model_path))
    cfg = files.config
    cpu = get_platform(torch.device("cpu"))
    model = LlamaForCausalLM(cfg, files.dequantized() if dequantize else files.weights, torch.float32, cpu)
    num_pages = 32
    kv = KVCache(cfg.num_layers, num_pages, page_size, cfg.num_kv_heads, cfg.head_dim, torch.float32, torch.device("cpu"))
    # pages in reverse order so that positions do not map to slots trivially
    pages = list(range(num_pages - 1, -1, -1))
    table = torch.tensor([pages])
    attn = make_attention_backend(attention, kv, table, cfg.num_heads, cpu, cfg.sliding_window, cfg.attention_sinks)

    def run(layout: BatchLayout) -> torch.Tensor:
        return model.forward(ForwardBatch.of(layout, attn.prepare(layout), cpu), attn)

    n = len(PROMPT)
    prefill = BatchLayout(page_size)
    prefill.add_extend(ids, 0, n, 0, pages, samples=False)
    prefill.sample_rows = list(range(n))   # every position's logits
    first = run(prefill)
    steps = []
    for pos in range(n, len(ids)):
        step = BatchLayout(page_size)
        step.add_decode(ids[pos], pos, 0, pages)
        steps.append(run(step)[0])
    return first, steps


def hf_logits(hf_model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([ids])).logits[0].float()


def hf_greedy(hf_model, steps: int) -> list[int]:
    ids = list(PROMPT)
    for _ in range(steps):
        ids.append(int(hf_logits(hf_model, ids)[-1].argmax()))
    return ids


@pytest.mark.parametrize("arch", ["llama", "llama_tied", "qwen2", "qwen3", "phi3", "phi4_mini", "mixtral", "qwen3_moe", "gemma3", "gpt_oss"])
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


@pytest.mark.parametrize("arch", ["gemma3", "gpt_oss"])
def test_sliding_windows_and_sinks_on_the_cpu_kernels_match_transformers(arch, tmp_path, default_tokenizer):
    """Decode steps past the window of 4, the C++ kernels' windowed plan and sinks."""
    hf = build_tiny_model(arch, tmp_path / arch, default_tokenizer)
    ids = hf_greedy(hf, DECODE_STEPS)
    ref = hf_logits(hf, ids)
    _, steps = our_logits(tmp_path / arch, ids, 4, attention="cpu")
    for i, row in enumerate(steps):
        torch.testing.assert_close(row, ref[len(PROMPT) + i], atol=ATOL, rtol=0)


# llama.cpp's layouts, as its converter writes them: llama (q/k rows permuted for its RoPE);
# qwen3moe (every layer's experts stacked in one tensor, the router beside); gemma3 (norms stored as
# 1 + weight, four norms a layer under their own names, the window pattern and soft-capping in the
# metadata); phi3 (fused q/k/v and gate/up, LongRoPE's factors as tensors, partial rotary as the
# rope's dimension count); gpt-oss (experts in MXFP4 with their biases, gate and up apart, sinks,
# YaRN as keys, the window pattern fixed)
@pytest.mark.parametrize("arch", ["llama_tied", "qwen3_moe_gguf", "gemma3_gguf", "phi4_mini", "gpt_oss_gguf"])
def test_gguf_export_of_a_tiny_model_matches_transformers(arch, tmp_path, default_model_files):
    from .gguf_export import write_llama_gguf

    hf = build_tiny_model(arch, tmp_path / "hf", default_model_files.tokenizer, seed=3)
    path = write_llama_gguf(hf, tmp_path / f"tiny-{arch}.gguf", default_model_files)
    ids = hf_greedy(hf, DECODE_STEPS)
    ref = hf_logits(hf, ids)
    # gpt-oss's experts are MXFP4 blocks, on the block kernels' int8 activations when not
    # dequantised (that form: the next test)
    prefill, steps = our_logits(path, ids, page_size=1, dequantize=arch == "gpt_oss_gguf")
    torch.testing.assert_close(prefill, ref[: len(PROMPT)], atol=ATOL, rtol=0)
    torch.testing.assert_close(torch.stack(steps), ref[len(PROMPT):], atol=ATOL, rtol=0)


@pytest.mark.parametrize("arch, quant", [("qwen3_moe_gguf", "Q8_0"), ("gpt_oss_gguf", None)])
def test_a_block_quantized_moe_gguf_runs_its_experts_on_the_block_kernels(arch, quant, tmp_path, default_model_files):
    """Each expert a view of the file's blocks (Q8_0; gpt-oss's MXFP4), computed by the block
    kernels close to the dequantised weights (int8 activations are the only difference; the
    router stays float)."""
    from .gguf_export import write_llama_gguf

    hf = build_tiny_model(arch, tmp_path / "hf", default_model_files.tokenizer, seed=5)
    path = write_llama_gguf(hf, tmp_path / "tiny-moe.gguf", default_model_files, quant=quant)
    files = load_model_files(str(path))
    cpu = get_platform(torch.device("cpu"))
    blocks = LlamaForCausalLM(files.config, files.weights, torch.float32, cpu).layers[0].moe
    exact = LlamaForCausalLM(files.config, files.dequantized(), torch.float32, cpu).layers[0].moe
    assert all(gate_up.quantized and down.quantized for gate_up, down in blocks.experts)
    h = torch.randn(16, files.config.hidden_size, generator=torch.Generator().manual_seed(0))
    assert torch.equal(blocks.route(h)[1], exact.route(h)[1])
    ours, ref = blocks(h), exact(h)
    assert float((ours - ref).norm() / ref.norm()) < 0.02
