"""The prefix cache's disk tier (`--cache-dir`), measured on real servers (default model), three parts:

- restart: a ~2,000-token system prompt is served cold; the server is SIGKILLed and restarted on the
  same cache dir; the same request again: cached tokens, identical text, latency against the cold one.
- eviction: agents with their own ~600-token system prompts, 3x what the KV pool holds, sending
  turns round-robin with 2 in flight; one server with --cache-dir, one without, alternately in one
  sitting: throughput and TTFT p50.
- spill: decode TPOT (the median gap between streamed tokens) of 2 streams whose unique prompts keep
  the pool evicting (every page is written, none is ever read back), with and without --cache-dir,
  alternating runs.

Writes bench/results/disk_cache.json (the parts run, next to those already there).

    .venv/bin/python bench/disk_cache.py                    # all three (~15 minutes on 2 cores)
    .venv/bin/python bench/disk_cache.py --parts restart    # one part
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx

from local_server import LocalServer

ROOT = Path(__file__).resolve().parents[1]
SENTENCE = "You are the dispatcher of a shipping company and answer in one short sentence. "   # ~16 tokens


def system_prompt(tag: str, tokens: int) -> str:
    return f"[{tag} {uuid.uuid4().hex[:8]}] " + SENTENCE * (tokens // 16)


def chat(url: str, system: str, user: str, max_tokens: int) -> dict:
    """One streamed chat request: text, TTFT, per-token times and usage."""
    body = {"model": "default", "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}
    t0 = time.perf_counter()
    text, stamps, usage = [], [], None
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=900) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices", []):
                if choice["delta"].get("content"):
                    text.append(choice["delta"]["content"])
                    stamps.append(time.perf_counter())
    end = time.perf_counter()
    return {"text": "".join(text), "ttft": stamps[0] - t0 if stamps else end - t0, "latency": end - t0,
            "tpot": (stamps[-1] - stamps[0]) / (len(stamps) - 1) if len(stamps) > 1 else None,
            "gaps": [b - a for a, b in zip(stamps, stamps[1:])],
            "prompt_tokens": usage["prompt_tokens"], "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"]}


def server(cache_dir, *flags: str) -> LocalServer:
    extra = ("--cache-dir", str(cache_dir)) if cache_dir else ()
    return LocalServer("--served-model-name", "default", *extra, *flags)


def wait_on_disk(url: str, pages: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while httpx.get(url + "/v1/cache", timeout=10).json()["disk"]["pages"] < pages:
        if time.monotonic() > deadline:
            raise RuntimeError("the prompt's pages did not reach the disk")
        time.sleep(0.05)


def part_restart(args) -> dict:
    directory = tempfile.mkdtemp(prefix="radixserve-cache-")
    system, rows = system_prompt("restart", args.restart_tokens), []
    try:
        for rnd in range(args.rounds):
            shutil.rmtree(directory, ignore_errors=True)
            s = server(directory, *args.flags)
            try:
                cold = chat(s.url, system, "Who are you?", 16)
                memory = chat(s.url, system, "Who are you?", 16)   # the same request, a hit in memory
                wait_on_disk(s.url, cold["prompt_tokens"] // 16)
            finally:
                s.proc.send_signal(signal.SIGKILL)
                s.proc.wait()
            t0 = time.perf_counter()
            s = server(directory, *args.flags)
            start = time.perf_counter() - t0
            try:
                warm = chat(s.url, system, "Who are you?", 16)
            finally:
                s.stop()
            rows.append({"cold": cold, "memory_hit": memory, "warm": warm, "restart_seconds": start,
                         "same_text": warm["text"] == cold["text"],
                         "same_text_as_memory_hit": warm["text"] == memory["text"],
                         "cached_share": warm["cached_tokens"] / warm["prompt_tokens"],
                         "speedup": cold["latency"] / warm["latency"]})
            print(f"restart round {rnd}: prompt {cold['prompt_tokens']} tokens, cold {cold['latency']:.2f} s, "
                  f"after SIGKILL + restart {warm['latency']:.2f} s ({rows[-1]['speedup']:.1f}x), cached "
                  f"{warm['cached_tokens']}, same text as cold {rows[-1]['same_text']}, as a memory hit "
                  f"{rows[-1]['same_text_as_memory_hit']}", flush=True)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return {"rows": rows, "speedup_median": statistics.median(r["speedup"] for r in rows)}


def agent_workload(url: str, systems: list[str], rounds: int, concurrency: int) -> dict:
    """Each round sends every agent one turn; `concurrency` requests in flight."""
    jobs = [(a, r) for r in range(rounds) for a in range(len(systems))]
    results, lock = [], threading.Lock()

    def worker():
        while True:
            with lock:
                if not jobs:
                    return
                agent, rnd = jobs.pop(0)
            out = chat(url, systems[agent], f"Turn {rnd}: where is parcel {agent}-{rnd}?", 16)
            with lock:
                results.append(out)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ttfts = sorted(r["ttft"] for r in results)
    return {"requests": len(results), "seconds": wall, "requests_per_s": len(results) / wall,
            "ttft_p50": statistics.median(ttfts), "ttft_p90": ttfts[int(0.9 * (len(ttfts) - 1))],
            "cached_share": sum(r["cached_tokens"] for r in results) / sum(r["prompt_tokens"] for r in results)}


def part_eviction(args) -> dict:
    pool = args.pool_tokens
    agents = max(2, -(-3 * pool // args.agent_tokens))   # their prompts: 3x the pool
    out = {"pool_tokens": pool, "agents": agents, "agent_tokens": args.agent_tokens, "runs": []}
    for rnd in range(args.rounds):
        for disk in (False, True):
            directory = tempfile.mkdtemp(prefix="radixserve-cache-") if disk else None
            systems = [system_prompt(f"agent {i}", args.agent_tokens) for i in range(agents)]
            s = server(directory, "--kv-cache-tokens", str(pool), *args.flags)
            try:
                run = agent_workload(s.url, systems, args.agent_rounds, 2)
            finally:
                s.stop()
                if directory:
                    shutil.rmtree(directory, ignore_errors=True)
            run["cache_dir"] = disk
            out["runs"].append(run)
            print(f"eviction round {rnd} {'with' if disk else 'without'} --cache-dir: {run['requests_per_s']:.3f} "
                  f"req/s, TTFT p50 {run['ttft_p50']:.2f} s, cached {run['cached_share']:.0%}", flush=True)
    with_, without = ([r for r in out["runs"] if r["cache_dir"] is d] for d in (True, False))
    out["throughput_ratio"] = statistics.median(w["requests_per_s"] / o["requests_per_s"] for w, o in zip(with_, without))
    out["ttft_p50_ratio"] = statistics.median(w["ttft_p50"] / o["ttft_p50"] for w, o in zip(with_, without))
    return out


def part_spill(args) -> dict:
    out = {"runs": []}
    for rnd in range(args.rounds):
        for disk in (False, True):
            directory = tempfile.mkdtemp(prefix="radixserve-cache-") if disk else None
            s = server(directory, "--kv-cache-tokens", str(args.pool_tokens), *args.flags)
            try:
                gaps, lock, jobs = [], threading.Lock(), list(range(args.spill_requests))

                def worker():
                    while True:
                        with lock:
                            if not jobs:
                                return
                            jobs.pop()
                        r = chat(s.url, system_prompt("unique", args.spill_prompt_tokens), "Go on.", 64)
                        with lock:
                            gaps.extend(r["gaps"])

                threads = [threading.Thread(target=worker) for _ in range(2)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                cache = httpx.get(s.url + "/v1/cache", timeout=10).json()
            finally:
                s.stop()
                if directory:
                    shutil.rmtree(directory, ignore_errors=True)
            # the median gap between streamed tokens: a decode step; the other stream's prefill
            # chunks land in a few long gaps, which a mean per request would count
            run = {"cache_dir": disk, "tpot_p50_ms": 1000 * statistics.median(gaps),
                   "evicted_tokens": cache["prefix_cache"]["evicted_tokens"],
                   "bytes_written": cache["disk"]["bytes_written"] if cache["disk"] else 0}
            out["runs"].append(run)
            print(f"spill round {rnd} {'with' if disk else 'without'} --cache-dir: TPOT p50 {run['tpot_p50_ms']:.1f} ms, "
                  f"evicted {run['evicted_tokens']} tokens, written {run['bytes_written'] / 1e6:.0f} MB", flush=True)
    with_, without = ([r for r in out["runs"] if r["cache_dir"] is d] for d in (True, False))
    out["tpot_ratio"] = statistics.median(w["tpot_p50_ms"] / o["tpot_p50_ms"] for w, o in zip(with_, without))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", nargs="+", default=["restart", "eviction", "spill"])
    ap.add_argument("--rounds", type=int, default=2, help="alternating repetitions of each part")
    ap.add_argument("--restart-tokens", type=int, default=2000)
    ap.add_argument("--pool-tokens", type=int, default=1536)
    ap.add_argument("--agent-tokens", type=int, default=600)
    ap.add_argument("--agent-rounds", type=int, default=4, help="turns each agent sends")
    ap.add_argument("--spill-requests", type=int, default=12)
    ap.add_argument("--spill-prompt-tokens", type=int, default=600)
    ap.add_argument("--flags", nargs="*", default=[], help="more `radixserve serve` flags, e.g. --flags=--dtype=float32")
    ap.add_argument("--out", default=str(ROOT / "bench/results/disk_cache.json"))
    args = ap.parse_args()
    out = Path(args.out)
    report = json.loads(out.read_text()) if out.exists() else {}   # parts run separately add up
    report.update(machine=platform.processor() or platform.machine(), cpus=os.cpu_count())
    command = (f"bench/disk_cache.py --parts {' '.join(args.parts)} --rounds {args.rounds}"
               + "".join(f" --flags={f}" for f in args.flags))
    for part in args.parts:
        report[part] = {"command": command, **globals()[f"part_{part}"](args)}
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
