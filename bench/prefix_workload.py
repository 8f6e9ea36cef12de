"""Prefix-heavy offline workload under memory pressure: schedule policies compared in one run.

4 system prompts of ~1,000 tokens, 64 requests (16 per prompt) with short user turns of their
own and 64 output tokens each, submitted together in a shuffled order, into a KV pool that
holds about two of the prompts. Runs `lpm`, `dfs-weight`, `fcfs` and `fcfs` with the radix
cache disabled, each on a fresh engine (default model, one process), and reports throughput,
mean / p99 time to first token, prefix-cache hit ratio, preemptions and evicted tokens.
Writes bench/results/prefix_workload.json.

    .venv/bin/python bench/prefix_workload.py                      # the full run (several minutes on CPU)
    .venv/bin/python bench/prefix_workload.py --requests 16 --system-len 256 --output-tokens 16 \\
        --out /tmp/prefix_smoke.json                               # a smoke run
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]

from radixserve.runtime.config import EngineConfig  # noqa: E402
from radixserve.runtime.engine import Engine  # noqa: E402
from radixserve.runtime.models.loader import load_model_files  # noqa: E402
from radixserve.runtime.sampling_params import SamplingParams  # noqa: E402

RUNS = {  # name -> EngineConfig overrides
    "lpm": dict(schedule_policy="lpm"),
    "dfs-weight": dict(schedule_policy="dfs-weight"),
    "fcfs": dict(schedule_policy="fcfs"),
    "radix-disabled": dict(schedule_policy="fcfs", disable_radix_cache=True),
}


def make_prompts(vocab: int, n_requests: int, n_system: int, system_len: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    tokens = lambda n: [rng.randrange(200, vocab - 200) for _ in range(n)]  # noqa: E731
    systems = [tokens(system_len) for _ in range(n_system)]
    prompts = [systems[i % n_system] + tokens(rng.randrange(20, 60)) for i in range(n_requests)]
    rng.shuffle(prompts)
    return prompts


def pool_tokens(args) -> int:
    """About `pool_prompts` requests' worth: system prompt, a user turn and the output each."""
    per_request = args.system_len + 60 + args.output_tokens
    return int(args.pool_prompts * per_request) // 16 * 16 + 16


def run_one(name: str, overrides: dict, files, prompts, args) -> dict:
    config = EngineConfig(dtype=args.dtype, kv_cache_tokens=pool_tokens(args), **overrides)
    engine = Engine(config, model_files=files)
    try:
        engine.generate(prompts[0][:32], SamplingParams(max_tokens=2, temperature=0.0))  # warm-up
        engine.flush_cache()
        base = engine.stats()
        params = SamplingParams(max_tokens=args.output_tokens, temperature=0.0, ignore_eos=True)
        t0 = time.perf_counter()
        # one wake-up per request: per-token reader threads would take CPU from the engine
        finals = [s.wait_finished()[-1] for s in [engine.submit(p, params) for p in prompts]]
        elapsed = time.perf_counter() - t0
        s = engine.stats()
    finally:
        engine.shutdown()
    errors = [f.error for f in finals if f.error]
    if errors:
        raise RuntimeError(f"{len(errors)} requests failed: {errors[0]}")
    ttft = sorted(f.time_to_first_token for f in finals)
    queried = s.prefix_cache_queried_tokens - base.prefix_cache_queried_tokens
    out_tokens = sum(f.completion_tokens for f in finals)
    row = {
        "run": name, "seconds": round(elapsed, 2), "output_tokens": out_tokens,
        "output_tok_per_s": round(out_tokens / elapsed, 1),
        "requests_per_s": round(len(prompts) / elapsed, 3),
        "ttft_mean_s": round(statistics.fmean(ttft), 2),
        "ttft_p99_s": round(ttft[max(0, int(len(ttft) * 0.99) - 1)], 2),
        "prefix_hit_ratio": round((s.prefix_cache_hit_tokens - base.prefix_cache_hit_tokens) / max(1, queried), 3),
        "preemptions": s.preemptions - base.preemptions,
        "evicted_tokens": s.evicted_tokens - base.evicted_tokens,
    }
    print(f"{name:>15}: {row['output_tok_per_s']:7.1f} out tok/s, TTFT mean {row['ttft_mean_s']:.2f} s "
          f"p99 {row['ttft_p99_s']:.2f} s, hit ratio {row['prefix_hit_ratio']:.3f}, "
          f"{row['preemptions']} preemptions, {row['evicted_tokens']} evicted tokens, {elapsed:.1f} s", flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--system-prompts", type=int, default=4)
    ap.add_argument("--system-len", type=int, default=1000, help="tokens per system prompt")
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--pool-prompts", type=float, default=2.0, help="KV pool size in requests' worth of tokens")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--runs", default=",".join(RUNS), help="comma-separated subset of " + ", ".join(RUNS))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "prefix_workload.json"))
    args = ap.parse_args()

    files = load_model_files(None)
    prompts = make_prompts(files.config.vocab_size, args.requests, args.system_prompts, args.system_len)
    print(f"{args.requests} requests, {args.system_prompts} system prompts of {args.system_len} tokens, "
          f"{args.output_tokens} output tokens, KV pool {pool_tokens(args)} tokens", flush=True)
    rows = [run_one(name, RUNS[name], files, prompts, args) for name in args.runs.split(",")]
    by_name = {r["run"]: r for r in rows}
    ratios = {}
    if "lpm" in by_name:
        for other in ("radix-disabled", "fcfs"):
            if other in by_name:
                ratios[f"lpm_vs_{other}_throughput"] = round(
                    by_name["lpm"]["output_tok_per_s"] / by_name[other]["output_tok_per_s"], 2)
    print(ratios)
    report = {
        "workload": {"requests": args.requests, "system_prompts": args.system_prompts,
                     "system_len": args.system_len, "user_len": "20-59", "output_tokens": args.output_tokens,
                     "kv_pool_tokens": pool_tokens(args), "arrival": "all at once, shuffled", "dtype": args.dtype},
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
        "runs": rows, "ratios": ratios,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
