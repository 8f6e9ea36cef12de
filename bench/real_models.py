"""radixserve and llama.cpp's server on the same real-shaped GGUF (bench/make_gguf.py), side by side
in one sitting: the figures of the real-models issue.

Per system and file: load time (start until /health is 200), one stream's TPOT (~130-token
prompts), the aggregate output tokens/s of 4 and 16 streams, TTFT of a ~3,000-token prompt, and
the server's resident memory after it all (VmRSS of its process tree). Streamed chat, greedy, EOS
ignored, a new prompt every request (no prefix cache helps). Systems alternate within a round.
Writes bench/results/real_models.json and prints a table. Never asserts anything about time.

    .venv/bin/python bench/real_models.py --models bench/models/llama-1b-Q4_K_M.gguf --rounds 2
    .venv/bin/python bench/real_models.py --models ... --rounds 5 --load-only   # start-up alone
    .venv/bin/python bench/real_models.py --models bench/models/llama-8b-Q4_K_M.gguf --cells "short c=1"
    .venv/bin/python bench/real_models.py --models bench/models/llama-1b-Q4_K_M.gguf --paired 8

--paired N: the one-stream cell alone, both servers up at once (one idle while the other serves),
N times each in alternation: on a machine whose speed drifts by more than the gap between the
systems from one minute to the next, each pair of runs meets the same minute, and the median of
the pairs' ratios says more than two rounds of whole sittings.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import compare  # noqa: E402
import serving  # noqa: E402
import single_stream  # noqa: E402
from single_stream import Cell  # noqa: E402

CELLS = (Cell("short", 90, 1, 4), Cell("short", 90, 4, 8), Cell("short", 90, 16, 16), Cell("long", 2950, 1, 1))


def tree_rss_mb(pid: int) -> float:
    """VmRSS of pid and its descendants, MB."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            status = Path(f"/proc/{p}/status").read_text()
            total += int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("VmRSS:")))
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, StopIteration):
            continue
    return total / 1024


def measure(system: compare.System, model: str, port: int, max_tokens: int, seed: int, log: Path,
            load_only: bool = False, cells: tuple[Cell, ...] = CELLS) -> dict:
    t0 = time.monotonic()
    proc = compare.start(system, port, model, log)
    out = {"load_s": time.monotonic() - t0, "cells": {}}
    base = f"http://127.0.0.1:{port}/v1"
    try:
        if load_only:
            out["rss_mb"] = tree_rss_mb(proc.pid)
            return out
        served = serving.served_model(base, None)
        single_stream.warm_up(base, served, max_tokens)
        for cell in cells:
            r = asyncio.run(single_stream.run_cell(base, served, cell, seed, max_tokens))
            out["cells"][single_stream.key(cell)] = {
                "tpot_p50_ms": r["tpot_s"]["p50"] * 1e3, "ttft_p50_s": r["ttft_s"]["p50"],
                "output_tok_per_s": r["output_tokens_per_s"], "prompt_tokens": r["prompt_tokens"] / max(1, r["completed"]),
                "failed": r["failed"]}
            print(f"  {system.name} {single_stream.key(cell)}: {out['cells'][single_stream.key(cell)]}", flush=True)
        out["rss_mb"] = tree_rss_mb(proc.pid)
    finally:
        compare.stop(proc)
    return out


def paired(systems: list[compare.System], model: str, port: int, max_tokens: int, n: int, logs: Path) -> dict:
    """The one-stream cell of each system n times, alternating, every server up throughout."""
    cell = CELLS[0]
    procs, bases = {}, {}
    out: dict = {"cell": single_stream.key(cell), "tpot_p50_ms": {s.name: [] for s in systems}}
    try:
        for i, system in enumerate(systems):
            log = logs / f"{Path(model).stem}-{system.name}-paired.log"
            procs[system.name] = compare.start(system, port + i, model, log)
            base = f"http://127.0.0.1:{port + i}/v1"
            bases[system.name] = (base, serving.served_model(base, None))
            single_stream.warm_up(*bases[system.name], max_tokens)
        for r in range(n):
            for system in (systems if r % 2 == 0 else list(reversed(systems))):
                res = asyncio.run(single_stream.run_cell(*bases[system.name], cell, 2000 + r, max_tokens))
                out["tpot_p50_ms"][system.name].append(res["tpot_s"]["p50"] * 1e3)
                print(f"  pair {r} {system.name}: {out['tpot_p50_ms'][system.name][-1]:.2f} ms", flush=True)
    finally:
        for proc in procs.values():
            compare.stop(proc)
    a, b = (out["tpot_p50_ms"][s.name] for s in systems[:2])
    ratios = sorted(x / y for x, y in zip(a, b))
    out["ratio_median"] = statistics.median(ratios)
    out["ratio_range"] = [ratios[0], ratios[-1]]
    out["medians_ms"] = {k: statistics.median(v) for k, v in out["tpot_p50_ms"].items()}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", required=True)
    p.add_argument("--systems", nargs="+", default=["radixserve", "llama.cpp"])
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--port", type=int, default=8500)
    p.add_argument("--out", type=Path, default=BENCH / "results" / "real_models.json")
    p.add_argument("--load-only", action="store_true", help="start, wait for /health, stop: load time and RSS only")
    p.add_argument("--cells", nargs="+", choices=[single_stream.key(c) for c in CELLS],
                   help="measure only these (an 8B shape's ~3k prefill takes minutes a system here)")
    p.add_argument("--paired", type=int, default=0, metavar="N",
                   help="the one-stream cell alone, N runs a system, alternating, all servers up at once")
    args = p.parse_args()
    all_systems = single_stream.systems(sys.executable)
    report = {"machine": compare.machine(), "rounds": args.rounds, "max_tokens": args.max_tokens,
              "load_only": args.load_only, "runs": {}}
    logs = BENCH / "results" / "real_models.logs"
    logs.mkdir(parents=True, exist_ok=True)
    if args.paired:
        report["paired"] = {}
        for model in args.models:
            res = paired([all_systems[n] for n in args.systems], model, args.port, args.max_tokens, args.paired, logs)
            report["paired"][Path(model).name] = res
            args.out.write_text(json.dumps(report, indent=1) + "\n")
            print(f"{Path(model).name}: TPOT p50 medians {res['medians_ms']}; {args.systems[0]} / {args.systems[1]} "
                  f"by pairs {res['ratio_median']:.3f} ({res['ratio_range'][0]:.3f}-{res['ratio_range'][1]:.3f})")
        return
    for model in args.models:
        runs = report["runs"].setdefault(Path(model).name, {"file_mb": os.path.getsize(model) / 2**20})
        for r in range(args.rounds):
            order = args.systems if r % 2 == 0 else list(reversed(args.systems))
            for name in order:
                print(f"{Path(model).name} round {r}: {name}", flush=True)
                res = measure(all_systems[name], model, args.port, args.max_tokens, 1000 + r,
                              logs / f"{Path(model).stem}-{name}-{r}.log", args.load_only,
                              tuple(c for c in CELLS if args.cells is None or single_stream.key(c) in args.cells))
                runs.setdefault(name, []).append(res)
                args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(table(report))


def table(report: dict) -> str:
    lines = ["| file | system | load s | TPOT c=1 ms | tok/s c=4 | tok/s c=16 | TTFT ~3k s | RSS MB |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for model, runs in report["runs"].items():
        for name, rs in runs.items():
            if name == "file_mb":
                continue
            med = lambda f: statistics.median(f(r) for r in rs)  # noqa: E731
            c = lambda k, m: med(lambda r: r["cells"][k][m]) if k in rs[0]["cells"] else float("nan")  # noqa: E731
            lines.append(f"| {model} ({runs['file_mb']:.0f} MiB) | {name} | {med(lambda r: r['load_s']):.1f} | "
                         f"{c('short c=1', 'tpot_p50_ms'):.1f} | {c('short c=4', 'output_tok_per_s'):.1f} | "
                         f"{c('short c=16', 'output_tok_per_s'):.1f} | {c('long c=1', 'ttft_p50_s'):.2f} | "
                         f"{med(lambda r: r['rss_mb']):.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
