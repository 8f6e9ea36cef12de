"""Decode speed for one user and at long contexts: radixserve's server side by side with llama.cpp's
on the same GGUF file, in one run on one machine (issue 22's table).

Cells (every request a new prompt, so that no prefix cache helps either server; streamed chat,
greedy, --max-tokens new tokens, EOS ignored):
  short  c=1   ~130-token prompts, one request at a time
  long   c=1   ~3,000-token prompts, one at a time
  long   c=8   ~3,000-token prompts, 8 at once
  short  c=32  ~130-token prompts, 32 at once (throughput: must not regress)

Systems: radixserve with default flags; `radixserve-torch` (the same server with the CPU kernels
off: RADIXSERVE_DISABLE_CPU_KERNELS=1, the torch path before them) when asked for; llama.cpp's
llama-server (`make bench-peers`), `-np 8 -c 65536 -t <cores>`. Each round starts every system
afresh, in an order that alternates between rounds; the table gives medians over rounds with
their spread. Writes bench/results/single_stream.{json,md,png}. Never asserts anything about time.

    .venv/bin/python bench/single_stream.py                       # radixserve and llama.cpp, 2 rounds
    .venv/bin/python bench/single_stream.py --systems radixserve radixserve-torch --rounds 3
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import compare  # noqa: E402
import serving  # noqa: E402


@dataclass(frozen=True)
class Cell:
    name: str
    words: int          # prompt words (about a token each; the chat template adds ~40)
    concurrency: int
    requests: int


CELLS = (Cell("short", 90, 1, 6), Cell("long", 2950, 1, 3), Cell("long", 2950, 8, 8), Cell("short", 90, 32, 64))


def systems(venv_python: str) -> dict[str, compare.System]:
    radixserve = [str(Path(venv_python).with_name("radixserve")), "serve", "--host", "127.0.0.1",
                  "--port", "{port}", "--model", "{model}"]
    cores = str(os.cpu_count() or 2)
    return {
        "radixserve": compare.System("radixserve", (), radixserve, "default flags"),
        "radixserve-torch": compare.System("radixserve-torch", (), ["env", "RADIXSERVE_DISABLE_CPU_KERNELS=1",
                                                                    *radixserve], "CPU kernels off"),
        "llama.cpp": compare.System("llama.cpp", (), [str(compare.LLAMA_SERVER), "-m", "{model}", "--host",
                                                      "127.0.0.1", "--port", "{port}", "-np", "8", "-c", "65536",
                                                      "-t", cores], f"llama-server -np 8 -c 65536 -t {cores}"),
    }


def prompts(cell: Cell, seed: int) -> list[str]:
    # each cell its own prompts: cells of a round with one seed once shared their first prompts, so a
    # later cell's requests hit the prefix caches of both servers
    tag = f"{seed}-{cell.name}-{cell.concurrency}"
    rng = random.Random(tag)
    return [f"Request {tag}-{i}. Summarise the following notes. " + serving._text(rng, cell.words)
            for i in range(cell.requests)]


async def run_cell(base_url: str, model: str, cell: Cell, seed: int, max_tokens: int) -> dict[str, Any]:
    sessions = [serving.Session(system=None, turns=[p]) for p in prompts(cell, seed)]
    args = argparse.Namespace(model=model, max_tokens=max_tokens, temperature=0.0, ignore_eos=True, api_key=None,
                              timeout=900.0, duration=0.0, base_url=base_url, seed=seed)
    results, elapsed = await serving.run_load(args, sessions, cell.concurrency, None)
    return serving.summarise(results, elapsed)


def warm_up(base_url: str, model: str, max_tokens: int) -> None:
    asyncio.run(run_cell(base_url, model, Cell("warm-up", 50, 2, 2), 12345, min(8, max_tokens)))


def key(cell: Cell) -> str:
    return f"{cell.name} c={cell.concurrency}"


def median_spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summary(runs: dict[str, dict[str, list[dict]]]) -> dict[str, dict[str, dict]]:
    """system -> cell -> median and spread over rounds of TPOT p50, TTFT p50, output tok/s."""
    out: dict[str, dict[str, dict]] = {}
    for system, cells in runs.items():
        for cell, reports in cells.items():
            ok = [r for r in reports if r["completed"]]
            if not ok:
                continue
            out.setdefault(system, {})[cell] = {
                "tpot_p50_ms": median_spread([r["tpot_s"]["p50"] * 1e3 for r in ok]),
                "ttft_p50_s": median_spread([r["ttft_s"]["p50"] for r in ok]),
                "output_tok_per_s": median_spread([r["output_tokens_per_s"] for r in ok]),
                "prompt_tokens": statistics.mean(r["prompt_tokens"] / r["completed"] for r in ok),
                "failed": sum(r["failed"] for r in reports),
            }
    return out


def table(report: dict) -> str:
    s, names = report["summary"], list(report["summary"])
    fmt = lambda v, unit, digits: f"{v['median']:.{digits}f}{unit} ({v['min']:.{digits}f}-{v['max']:.{digits}f})"  # noqa: E731
    head = "| prompt | concurrency | " + " | ".join(f"{n}: TPOT p50" for n in names) + " | " + \
           " | ".join(f"{n}: TTFT p50" for n in names) + " | " + " | ".join(f"{n}: out tok/s" for n in names) + " |"
    lines = [head, "|" + "---|" * (2 + 3 * len(names))]
    for cell in CELLS:
        k = key(cell)
        cells = [s[n].get(k) for n in names]
        if not any(cells):
            continue
        tokens = next(c["prompt_tokens"] for c in cells if c)
        row = [f"~{tokens:,.0f} tokens", str(cell.concurrency)]
        row += [fmt(c["tpot_p50_ms"], " ms", 1) if c else "-" for c in cells]
        row += [fmt(c["ttft_p50_s"], " s", 2) if c else "-" for c in cells]
        row += [fmt(c["output_tok_per_s"], "", 0) if c else "-" for c in cells]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def chart(report: dict, path: Path) -> None:
    try:
        import matplotlib
    except ImportError:   # the figures are in the JSON and the table; the chart is optional
        print("no matplotlib: no chart", flush=True)
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s, names = report["summary"], list(report["summary"])
    cells = [key(c) for c in CELLS if key(c) in {k for n in names for k in s[n]}]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    width = 0.8 / max(1, len(names))
    for ax, metric, label in ((axes[0], "tpot_p50_ms", "time per output token, p50 (ms)"),
                              (axes[1], "output_tok_per_s", "output tokens/s")):
        for i, n in enumerate(names):
            vals = [s[n].get(c, {}).get(metric, {}).get("median", 0) for c in cells]
            ax.bar([x + i * width for x in range(len(cells))], vals, width, label=n)
        ax.set_xticks([x + width * (len(names) - 1) / 2 for x in range(len(cells))], cells)
        ax.set_ylabel(label)
        ax.legend()
    fig.suptitle(f"{report['model']} on {report['machine']['cpu']}, {report['machine']['cores']} cores "
                 f"(medians of {report['rounds']} rounds)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--systems", nargs="+", default=None, help="default: radixserve, and llama.cpp if built")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--model", default=None, help="GGUF file (default: the embedded model)")
    p.add_argument("--port", type=int, default=8400)
    p.add_argument("--out", default=str(BENCH / "results" / "single_stream.json"))
    p.add_argument("--cells", nargs="+", default=None, metavar="NAME-CONCURRENCY",
                   help="a subset of the table's cells, e.g. short-1 long-8 (default: all)")
    args = p.parse_args(argv)
    cells = [c for c in CELLS if args.cells is None or f"{c.name}-{c.concurrency}" in args.cells]
    if not cells:
        p.error(f"--cells: none of {args.cells} is one of " + ", ".join(f"{c.name}-{c.concurrency}" for c in CELLS))
    from radixserve.runtime.models.loader import default_model_path
    model = args.model or str(default_model_path())
    available = systems(sys.executable)
    names = args.systems or ["radixserve"] + (["llama.cpp"] if compare.LLAMA_SERVER.exists() else [])
    runs: dict[str, dict[str, list[dict]]] = {n: {} for n in names}
    logs = Path(args.out).with_suffix(".logs")
    logs.mkdir(parents=True, exist_ok=True)
    for r in range(args.rounds):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            proc = compare.start(available[name], args.port, model, logs / f"{name}-{r}.log")
            try:
                base = f"http://127.0.0.1:{args.port}/v1"
                served = serving.served_model(base, None)
                warm_up(base, served, args.max_tokens)
                for cell in cells:
                    # the same prompts for every system within a round, new ones each round
                    rep = asyncio.run(run_cell(base, served, cell, 1000 * r + CELLS.index(cell), args.max_tokens))
                    runs[name].setdefault(key(cell), []).append(rep)
                    print(f"round {r} {name:16} {key(cell):11} TPOT p50 {rep['tpot_s']['p50'] and rep['tpot_s']['p50'] * 1e3:.1f} ms"
                          f"  TTFT p50 {rep['ttft_s']['p50'] or 0:.2f} s  {rep['output_tokens_per_s']:.1f} tok/s"
                          f"  prompt {rep['prompt_tokens'] / max(1, rep['completed']):.0f} tokens"
                          f"  failed {rep['failed']}", flush=True)
            finally:
                compare.stop(proc)
    report = {"machine": compare.machine(), "model": Path(model).name, "rounds": args.rounds,
              "max_tokens": args.max_tokens, "systems": {n: available[n].description for n in names},
              "cells": [vars(c) for c in cells], "summary": summary(runs), "runs": runs,
              "command": "bench/single_stream.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    out = Path(args.out)
    out.write_text(json.dumps(report, indent=1) + "\n")
    md = table(report)
    out.with_suffix(".md").write_text(md + "\n")
    chart(report, out.with_suffix(".png"))
    print(md)
    print("wrote", out, out.with_suffix(".md"), out.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
