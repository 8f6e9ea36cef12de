"""Scheduler overhead per step with a long waiting queue, without a model.

The real Scheduler, KVManager and radix tree are driven by tests/schedule_sim.py (each step
does to the KV state what the engine does), so the time measured is the scheduler's alone:
queue ordering against the tree, in-batch prefix-sharing checks, admission and page
accounting. Compare it with a decode step of the default model at batch 32 (bench/offline.py).
Also times one `lpm` ordering pass for growing queue lengths, which is what decides where lpm
falls back to queue order (CACHE_AWARE_MAX_QUEUE). Writes bench/results/scheduler_overhead.json.

    .venv/bin/python bench/scheduler_overhead.py
    .venv/bin/python bench/scheduler_overhead.py --waiting 256 --json bench/results/scheduler_overhead_256.json
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # schedule_sim: the scheduler over a fake model

from radixserve.runtime.schedule_policy import DFSWeightPolicy, LongestPrefixPolicy  # noqa: E402
from schedule_sim import SimEngine  # noqa: E402

N_SYSTEM, SYSTEM_LEN, N_WAITING, BATCH = 4, 1000, 1000, 32


_rng = random.Random(0)
SYSTEMS = [[_rng.randrange(200, 40000) for _ in range(SYSTEM_LEN)] for _ in range(N_SYSTEM)]


def make_prompts(n: int, seed: int = 0) -> list[list[int]]:
    """`n` requests: one of the shared system prompts and a short user turn of their own."""
    rng = random.Random(seed)
    return [rng.choice(SYSTEMS) + [rng.randrange(200, 40000) for _ in range(rng.randrange(20, 80))]
            for _ in range(n)]


def step_overhead(policy: str, n_waiting: int, bound: str, steps: int = 300) -> dict:
    """schedule() time per step with about `BATCH` running and `n_waiting` waiting.

    bound="slots": the running limit is BATCH, so most steps admit nobody. bound="pages": the
    running limit is 64 and the pool holds about BATCH requests, so every step orders the
    queue and tries to admit (the expensive case).
    """
    if bound == "slots":
        sim = SimEngine(kv_cache_tokens=1 << 17, schedule_policy=policy, max_running_requests=BATCH)
    else:
        sim = SimEngine(kv_cache_tokens=N_SYSTEM * SYSTEM_LEN + BATCH * 150, schedule_policy=policy,
                        max_running_requests=64)
    rng = random.Random(1)
    for prompt in make_prompts(n_waiting + BATCH):
        sim.submit(prompt, max_tokens=rng.randrange(16, 96))
    running = []
    while len(sim.schedule_seconds) < steps:
        sim.step()
        running.append(len(sim.scheduler.running))
        missing = n_waiting + BATCH - len(sim.scheduler.waiting) - len(sim.scheduler.running)
        for prompt in make_prompts(missing, seed=len(sim.schedule_seconds)):  # keep the queue full
            sim.submit(prompt, max_tokens=rng.randrange(16, 96))
    ms = sorted(t * 1000 for t in sim.schedule_seconds[20:])  # after the first prefills: steady state
    mean_running = statistics.fmean(running[20:])
    return {"policy": policy, "waiting": n_waiting, "bound": bound, "mean_running": round(mean_running, 1),
            "mean_ms": statistics.fmean(ms),
            "p99_ms": ms[int(len(ms) * 0.99) - 1], "max_ms": ms[-1]}


def ordering_cost(policy_cls, lengths=(32, 64, 128, 256, 512, 1000)) -> list[dict]:
    """One full cache-aware ordering pass (no fallback) against a tree holding the system prompts."""
    sim = SimEngine(kv_cache_tokens=1 << 17)
    for prompt in make_prompts(N_SYSTEM * 4, seed=9):   # cache the system prompts
        sim.submit(prompt, max_tokens=1)
    sim.run()
    policy = policy_cls(max_queue_wait_boost=1e9, max_queue=1 << 30)
    out = []
    for n in lengths:
        waiting = [sim.submit(p) for p in make_prompts(n, seed=n)]
        t = time.perf_counter()
        for _ in range(5):
            policy.order(waiting, sim.kv.tree)
        out.append({"waiting": n, "ms": (time.perf_counter() - t) / 5 * 1000})
        sim.scheduler.waiting.clear()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--waiting", type=int, nargs="+", default=[128, N_WAITING], help="queue lengths to time")
    p.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "scheduler_overhead.json")
    args = p.parse_args()
    results = {
        "step_overhead": [step_overhead(policy, n, bound) for bound in ("slots", "pages")
                          for policy in ("lpm", "dfs-weight", "fcfs") for n in args.waiting],
        "lpm_ordering_no_fallback": ordering_cost(LongestPrefixPolicy),
        "dfs_weight_ordering_no_fallback": ordering_cost(DFSWeightPolicy),
    }
    for row in results["step_overhead"]:
        print(f"{row['policy']:>10} waiting {row['waiting']:>5}, {row['bound']}-bound, running "
              f"{row['mean_running']:>4}: schedule() "
              f"mean {row['mean_ms']:.2f} ms, p99 {row['p99_ms']:.2f} ms, max {row['max_ms']:.2f} ms")
    for key in ("lpm_ordering_no_fallback", "dfs_weight_ordering_no_fallback"):
        print(key + ": " + ", ".join(f"{r['waiting']}: {r['ms']:.2f} ms" for r in results[key]))
    out = args.json.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
