"""What keeping sliding-window layers' K/V only where a window reads it buys (issue 34's figure): a
Gemma-3-shaped model (hidden 1024, 12 layers, 10 of them windowed to 512 tokens; random weights
written with transformers' own class), served with the window pool (`hybrid`, the default,
`--swa-full-tokens-ratio 0.25` here) and without it (`--disable-hybrid-swa-memory`), at the same
bytes of KV cache:

- `memory`: KV bytes a token takes, and the tokens a pool of the same bytes holds;
- `concurrent`: six requests with distinct ~1,500-token prompts, 128 tokens each, sent at once:
  wall time, output tokens per second, and the most that ran at once (without the window pool two
  fit; with it, more);
- `tpot`: one request's decode step at ~3,000 tokens of context (the window pool's cost a step:
  the window page table built on the host, the window layers read through it).

Each timing runs in a child process of its own (see bench/families.py on OpenMP pools), the two
forms alternating round by round. Writes bench/results/window_kv.json (or --out); reports figures,
never asserts.

    .venv/bin/python bench/window_kv.py [--rounds 2] [--parts memory,concurrent,tpot]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))   # after site-packages: the checkout's kernels/ must not shadow HF's `kernels`

from compare import machine  # noqa: E402  (bench/, beside this script)
from families import LONG_PROMPT, spread, tpot_ms, windowed_gemma3, write_model  # noqa: E402
from radixserve.runtime.config import EngineConfig  # noqa: E402
from radixserve.runtime.engine import Engine  # noqa: E402
from radixserve.runtime.models.loader import load_model_files  # noqa: E402
from radixserve.runtime.sampling_params import SamplingParams  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "window_kv.json"
RATIO = 0.25
FULL_TOKENS = 4096          # the pool without the window pool; the hybrid one gets the same bytes
REQUESTS, PROMPT_TOKENS, OUTPUT_TOKENS = 6, 1500, 128


def config(hybrid: bool, tokens: int) -> EngineConfig:
    return EngineConfig(kv_cache_tokens=tokens, swa_full_tokens_ratio=RATIO, disable_hybrid_swa_memory=not hybrid)


def kv_bytes(engine: Engine) -> int:
    caches = [c for c in (engine.kv_cache.full, engine.kv_cache.windowed) if c is not None]
    return sum(2 * c.k.numel() * c.k.element_size() for c in caches)


def hybrid_tokens(path: Path) -> int:
    """The KV pool, in tokens, whose hybrid form takes the bytes of FULL_TOKENS without it."""
    mc = load_model_files(str(path), weights=False).config
    windowed = mc.num_windowed_layers
    tokens = int(FULL_TOKENS * mc.num_layers / (mc.num_layers - windowed + RATIO * windowed))
    return tokens - tokens % EngineConfig().page_size


def measure_here(args) -> None:
    engine = Engine(config(args.hybrid == "on", args.tokens), model_files=load_model_files(args.measure))
    out: dict = {"kv_bytes": kv_bytes(engine), "pool_tokens": engine.pool.num_slots, "dtype": str(engine.dtype),
                 "window_pool_tokens": 0 if engine.windows is None else engine.windows.num_pages * engine.pool.page_size}
    if args.what == "tpot":
        out["tpot_ms"] = tpot_ms(engine, args.steps, LONG_PROMPT)
    elif args.what == "concurrent":
        prompts = [[200 + (i * 7919 + r * 104729) % 40000 for i in range(PROMPT_TOKENS)] for r in range(REQUESTS)]
        params = SamplingParams(max_tokens=OUTPUT_TOKENS, temperature=0.0, ignore_eos=True)
        running: list[int] = []
        done = threading.Event()

        def watch() -> None:   # how many run at once, sampled (a read of a list's length)
            while not done.wait(0.01):
                running.append(len(engine.scheduler.running))
        watcher = threading.Thread(target=watch)
        start = time.perf_counter()
        watcher.start()
        for stream in [engine.submit(p, params) for p in prompts]:
            stream.wait_finished()
        seconds = time.perf_counter() - start
        done.set()
        watcher.join()
        out.update(seconds=seconds, output_tok_per_s=REQUESTS * OUTPUT_TOKENS / seconds, most_running=max(running))
    print(json.dumps(out))
    engine.shutdown()


def measure(path: Path, what: str, hybrid: bool, tokens: int, steps: int) -> dict:
    cmd = [sys.executable, __file__, "--measure", str(path), "--what", what, "--hybrid", "on" if hybrid else "off",
           "--tokens", str(tokens), "--steps", str(steps)]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--parts", default="memory,concurrent,tpot")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--measure", help=argparse.SUPPRESS)
    p.add_argument("--what", default="memory", help=argparse.SUPPRESS)
    p.add_argument("--hybrid", default="on", help=argparse.SUPPRESS)
    p.add_argument("--tokens", type=int, default=FULL_TOKENS, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.measure:
        return measure_here(args)
    parts = args.parts.split(",")
    report: dict = {"command": "bench/window_kv.py " + " ".join(sys.argv[1:]), "machine": machine(),
                    "swa_full_tokens_ratio": RATIO}
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = load_model_files(None, weights=False).tokenizer
        path, _ = write_model(windowed_gemma3(), Path(tmp) / "gemma3_windowed", tokenizer)
        tokens = {True: hybrid_tokens(path), False: FULL_TOKENS}
        name = {True: "hybrid", False: "full"}
        for part in parts:
            runs: dict[bool, list[dict]] = {True: [], False: []}
            for r in range(1 if part == "memory" else args.rounds):
                for hybrid in ((True, False) if r % 2 == 0 else (False, True)):
                    runs[hybrid].append(measure(path, part, hybrid, tokens[hybrid], args.steps))
                    print(part, name[hybrid], r, runs[hybrid][-1], flush=True)
            report[part] = {name[h]: dict(runs[h][-1]) for h in runs}
            for h in runs:
                row = report[part][name[h]]
                row["kv_bytes_per_pool_token"] = round(row["kv_bytes"] / row["pool_tokens"])
                for key in ("tpot_ms", "seconds", "output_tok_per_s"):
                    if key in row:
                        row[key] = spread([x[key] for x in runs[h]])
            if part == "concurrent":
                report[part]["hybrid_over_full_tok_per_s"] = round(
                    statistics.median(x["output_tok_per_s"] for x in runs[True])
                    / statistics.median(x["output_tok_per_s"] for x in runs[False]), 2)
            if part == "tpot":
                report[part]["hybrid_over_full_tpot"] = round(statistics.median(x["tpot_ms"] for x in runs[True])
                                                              / statistics.median(x["tpot_ms"] for x in runs[False]), 3)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
