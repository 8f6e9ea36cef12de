"""Run by tests/test_triton_attention.py in a subprocess with TRITON_INTERPRET=1: greedy outputs of
an engine on the Triton attention backend (kernels interpreted on CPU tensors) equal the torch
backend's, on a tiny random model (GQA 3) with a prefix-cache hit, a chunked prefill and a step
mixing decodes with extends, at page sizes 16 and 1; and so do decode steps run through the
CUDA-graph runner's padded static batches (eagerly: no graphs on CPU), and on a model with a
sliding-window layer (its K/V in a window pool at its smallest) and attention sinks. The Triton engines first run the CUDA platform's warm-up
step, which must leave no trace. Exit 1 on any difference."""
from __future__ import annotations

import os
import sys


import torch  # noqa: E402

from radixserve.runtime.config import EngineConfig  # noqa: E402
from radixserve.runtime.engine import Engine  # noqa: E402
from radixserve.runtime.models.config import ModelConfig  # noqa: E402
from radixserve.runtime.models.loader import ModelFiles, load_model_files  # noqa: E402
from radixserve.runtime.models.random_init import random_weights  # noqa: E402
from radixserve.runtime.sampling_params import SamplingParams  # noqa: E402

GREEDY = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)


def tiny_files(windowed: bool = False) -> ModelFiles:
    """A tiny random Llama; `windowed`: its first layer sees a sliding window of 6 positions and
    every layer has attention sinks (Gemma 3's local layers, gpt-oss's sinks)."""
    tokenizer = load_model_files(None).tokenizer  # the vocabulary the tiny model's ids come from
    cfg = ModelConfig(model_type="llama", hidden_size=96, num_layers=2, num_heads=6, num_kv_heads=2, head_dim=16,
                      intermediate_size=128, vocab_size=49152, max_context_len=256,
                      layer_windows=(6, 0) if windowed else (), attention_sinks=windowed)
    weights = random_weights(cfg, std=0.08, seed=1)
    if windowed:
        gen = torch.Generator().manual_seed(2)
        for i in range(cfg.num_layers):
            weights[f"model.layers.{i}.self_attn.sinks"] = torch.randn(cfg.num_heads, generator=gen)
    return ModelFiles("tiny-random", cfg, weights, tokenizer)


def run(files: ModelFiles, backend: str, page_size: int, prompts: list[list[int]],
        padded_decode: bool = False) -> list[list[int]]:
    # the windowed model's window pool at its smallest: its pages are given back and taken again
    engine = Engine(EngineConfig(device="cpu", dtype="float32", attention_backend=backend, page_size=page_size,
                                 kv_cache_tokens=1024, chunked_prefill_size=16, max_batched_tokens=64,
                                 max_running_requests=4, swa_full_tokens_ratio=0.001), model_files=files)
    try:
        # only Triton's has graph hooks, and not with a window pool (its page table is built each step)
        windowed = engine.windows is not None
        assert (engine.runner.attention.graphs is not None) == (backend == "triton" and not windowed)
        if padded_decode:  # the CUDA-graph path without the graphs: static batches padded to 1/2/4
            assert engine.runner.use_decode_graphs(4, files.config.max_context_len, capture=False)
        if backend == "triton":  # CudaPlatform's warm-up: a dummy step launches every kernel, then the pad page is zeroed
            engine.runner.warm_up()
            engine.kv_cache.clear_pad_page()
        first = engine.generate([prompts[0]], GREEDY)
        # the second request shares the first's prefix (a cache hit); the third is chunked 16/16/5;
        # three decode together (padded to 4 on the graph path)
        rest = engine.generate(prompts[1:], GREEDY)
        assert rest[0].cached_tokens >= 16, rest[0].cached_tokens
        return [r.token_ids for r in first + rest]
    finally:
        engine.shutdown()


def main() -> int:
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    files = tiny_files()
    gen = torch.Generator().manual_seed(0)
    base = torch.randint(0, 49152, (20,), generator=gen).tolist()
    prompts = [base, base[:18] + torch.randint(0, 49152, (6,), generator=gen).tolist(),
               torch.randint(0, 49152, (37,), generator=gen).tolist(), torch.randint(0, 49152, (3,), generator=gen).tolist()]
    failures = 0
    windowed = tiny_files(windowed=True)
    want, got = run(windowed, "torch", 16, prompts), run(windowed, "triton", 16, prompts)
    if got != want:
        failures += 1
        print(f"sliding window and sinks: triton {got} != torch {want}")
    for page_size in (16, 1):
        want = run(files, "torch", page_size, prompts)
        got = run(files, "triton", page_size, prompts)
        if got != want:
            failures += 1
            print(f"page_size={page_size}: triton {got} != torch {want}")
        if page_size == 16:
            padded = run(files, "triton", page_size, prompts, padded_decode=True)
            if padded != want:
                failures += 1
                print(f"padded decode: triton {padded} != torch {want}")
    print(f"{failures} differences")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
