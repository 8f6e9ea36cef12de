"""Offline throughput: radixserve's Engine.generate vs transformers generate() in static batches.

64 prompts of ~200 tokens (half share a 150-token prefix), 128 new tokens each, same model
(the embedded default), same dtype, one process, one run. Also: decode step time at batch
1 / 8 / 32 with ~300 tokens of context, and prefill tokens/s. Writes bench/results/offline.json.

    .venv/bin/python bench/offline.py [--dtype bfloat16] [--skip-hf]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from radixserve.runtime.config import EngineConfig  # noqa: E402
from radixserve.runtime.engine import Engine  # noqa: E402
from radixserve.runtime.models.loader import load_model_files  # noqa: E402
from radixserve.runtime.sampling_params import SamplingParams  # noqa: E402

N_PROMPTS, PROMPT_LEN, SHARED_LEN, NEW_TOKENS, STATIC_BATCH = 64, 200, 150, 128, 16


def make_prompts(vocab: int) -> list[list[int]]:
    rng = random.Random(0)
    words = lambda n: [rng.randrange(200, vocab - 200) for _ in range(n)]  # noqa: E731
    shared = words(SHARED_LEN)
    return [(shared + words(PROMPT_LEN - SHARED_LEN)) if i % 2 == 0 else words(PROMPT_LEN)
            for i in range(N_PROMPTS)]


def bench_engine(engine: Engine, prompts) -> dict:
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    engine.generate(prompts[:2], SamplingParams(max_tokens=4, temperature=0.0))  # warm-up
    engine.flush_cache()
    t = time.perf_counter()
    results = engine.generate(prompts, params)
    elapsed = time.perf_counter() - t
    out_tokens = sum(len(r.token_ids) for r in results)
    return {"seconds": elapsed, "output_tokens": out_tokens, "output_tok_per_s": out_tokens / elapsed,
            "cached_prompt_tokens": sum(r.cached_tokens for r in results)}


def decode_step_ms(engine: Engine, batch: int, context: int = 300, steps: int = 64) -> float:
    rng = random.Random(batch)
    prompts = [[rng.randrange(200, 40000) for _ in range(context)] for _ in range(batch)]
    engine.generate(prompts, SamplingParams(max_tokens=1, temperature=0.0))  # prompts now cached
    s0, t = engine.steps, time.perf_counter()
    engine.generate(prompts, SamplingParams(max_tokens=steps, temperature=0.0, ignore_eos=True))
    ms = (time.perf_counter() - t) / (engine.steps - s0) * 1000
    engine.flush_cache()
    return ms


def prefill_tok_per_s(engine: Engine, n: int = 8, length: int = 512) -> float:
    rng = random.Random(7)
    prompts = [[rng.randrange(200, 40000) for _ in range(length)] for _ in range(n)]
    t = time.perf_counter()
    engine.generate(prompts, SamplingParams(max_tokens=1, temperature=0.0))
    tps = n * length / (time.perf_counter() - t)
    engine.flush_cache()
    return tps


def bench_hf_static(files, dtype: torch.dtype, prompts) -> dict:
    """transformers generate() with fixed batches of 16: a batch runs until its longest member ends."""
    import transformers as tf

    c = files.config
    cfg = tf.LlamaConfig(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                         num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads,
                         num_key_value_heads=c.num_kv_heads, head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps,
                         rope_theta=c.rope_theta, max_position_embeddings=c.max_context_len,
                         tie_word_embeddings=c.tie_word_embeddings, pad_token_id=0)
    model = tf.LlamaForCausalLM(cfg)
    model.load_state_dict(files.weights, strict=False)
    model = model.to(dtype).eval()
    t = time.perf_counter()
    out_tokens = 0
    for i in range(0, len(prompts), STATIC_BATCH):
        batch = prompts[i:i + STATIC_BATCH]
        width = max(len(p) for p in batch)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS,
                                 min_new_tokens=NEW_TOKENS, do_sample=False)
        out_tokens += (out.shape[1] - width) * len(batch)
    elapsed = time.perf_counter() - t
    return {"seconds": elapsed, "output_tokens": out_tokens, "output_tok_per_s": out_tokens / elapsed}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "offline.json"))
    args = ap.parse_args()
    files = load_model_files(None)
    prompts = make_prompts(files.config.vocab_size)
    engine = Engine(EngineConfig(dtype=args.dtype, kv_cache_tokens=65536, max_running_requests=64),
                    model_files=files)
    report = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                         f"torch {torch.__version__}, {torch.get_num_threads()} threads",
              "dtype": args.dtype, "model": engine.model_name,
              "workload": f"{N_PROMPTS} prompts x ~{PROMPT_LEN} tokens (half share {SHARED_LEN}), "
                          f"{NEW_TOKENS} new tokens each"}
    try:
        report["radixserve"] = bench_engine(engine, prompts)
        print("radixserve", report["radixserve"], flush=True)
        report["decode_step_ms"] = {b: decode_step_ms(engine, b) for b in (1, 8, 32)}
        print("decode step ms", report["decode_step_ms"], flush=True)
        report["prefill_tok_per_s"] = prefill_tok_per_s(engine)
        print("prefill tok/s", report["prefill_tok_per_s"], flush=True)
    finally:
        engine.shutdown()
    if not args.skip_hf:
        report["transformers_static_batch16"] = bench_hf_static(files, engine.dtype, prompts)
        print("transformers", report["transformers_static_batch16"], flush=True)
        report["throughput_ratio"] = (report["radixserve"]["output_tok_per_s"]
                                      / report["transformers_static_batch16"]["output_tok_per_s"])
        print("ratio", round(report["throughput_ratio"], 2))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
