"""radixserve side by side with what users would pick instead, in one run on one machine.

Starts each system as a real server on a loopback port, drives it with bench/serving.py's
workloads (same prompts, same seed, same model file), stops it, and moves on:

  radixserve             the default configuration
  radixserve-no-radix    --disable-radix-cache: what prefix reuse buys
  radixserve-fcfs        --schedule-policy fcfs: what prefix-aware ordering buys
  static                 transformers generate() in fixed batches (bench/peers/static_server.py)
  llama.cpp              llama.cpp's own server on the same GGUF, if `make bench-peers` built it

Writes bench/results/compare.json, bench/results/compare.png and bench/results/compare.md (the
table README.md shows). Never asserts anything about time.

    .venv/bin/python bench/compare.py                      # everything, ~35 minutes on 2 cores
    .venv/bin/python bench/compare.py --systems radixserve static --workloads random --duration 10
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import httpx

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))
import serving  # noqa: E402

WORKLOADS = ("shared-prefix", "multi-turn", "json-schema", "random")
LLAMA_SERVER = BENCH / "peers" / "llama.cpp" / "bin" / "llama-server"


@dataclass
class System:
    name: str
    workloads: tuple[str, ...]        # which workloads it runs (variants only where they differ)
    command: list[str]                # argv; "{port}" and "{model}" are filled in
    description: str


def systems(venv_python: str) -> list[System]:
    radixserve = [str(Path(venv_python).with_name("radixserve")), "serve", "--host", "127.0.0.1",
                  "--port", "{port}", "--model", "{model}"]
    sharing = ("shared-prefix", "multi-turn")
    return [
        System("radixserve", WORKLOADS, radixserve, "default flags"),
        System("radixserve-no-radix", sharing, radixserve + ["--disable-radix-cache"], "--disable-radix-cache"),
        System("radixserve-fcfs", sharing, radixserve + ["--schedule-policy", "fcfs"], "--schedule-policy fcfs"),
        System("static", WORKLOADS, [venv_python, str(BENCH / "peers" / "static_server.py"), "--port", "{port}",
                                     "--model", "{model}"],
               "transformers generate(), batches of <= 32, 0.5 s fill timeout"),
        System("llama.cpp", WORKLOADS, [str(LLAMA_SERVER), "-m", "{model}", "--host", "127.0.0.1", "--port", "{port}",
                                        "-np", "32", "-c", "65536", "-t", str(os.cpu_count() or 2)],
               "llama-server from llama-cpp-python 0.3.36's llama.cpp, 32 slots x 2048 tokens"),
    ]


def start(system: System, port: int, model: str, log: Path) -> subprocess.Popen:
    argv = [a.replace("{port}", str(port)).replace("{model}", model) for a in system.command]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with log.open("w") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                start_new_session=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{system.name} exited with {proc.returncode}; see {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    stop(proc)
    raise RuntimeError(f"{system.name} did not become healthy in 300 s; see {log}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def run_workload(base_url: str, workload: str, concurrency: int, args: argparse.Namespace, seed: int,
                 duration: float, max_tokens: int) -> dict[str, Any]:
    sargs = serving.parse_args(["--base-url", base_url, "--workload", workload,
                                "--num-requests", str(args.num_requests), "--duration", str(duration),
                                "--max-tokens", str(max_tokens), "--seed", str(seed),
                                "--prefix-words", str(args.prefix_words)])
    sargs.model = serving.served_model(base_url, None)
    sessions = serving.make_sessions(workload, sargs.num_requests, random.Random(sargs.seed), sargs)
    results, elapsed = asyncio.run(serving.run_load(sargs, sessions, concurrency, None))
    return serving.summarise(results, elapsed)


def machine() -> dict[str, Any]:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem_kb = next(int(l.split()[1]) for l in Path("/proc/meminfo").read_text().splitlines()
                      if l.startswith("MemTotal"))
    except (OSError, StopIteration):
        mem_kb = 0
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(mem_kb / 2**20), "platform": platform.platform(),
            "python": platform.python_version()}


# ---- report -------------------------------------------------------------------------------------
def cell(report: dict, system: str, workload: str, conc: int) -> Optional[dict]:
    return report["results"].get(system, {}).get(workload, {}).get(str(conc))


def ratios(report: dict) -> list[str]:
    """The comparisons the issue names, as lines of text."""
    lines = []

    def ratio(a: Optional[dict], b: Optional[dict], key: str, lower_is_better: bool = False) -> Optional[float]:
        if not a or not b:
            return None
        x = a[key]["p50"] if isinstance(a[key], dict) else a[key]
        y = b[key]["p50"] if isinstance(b[key], dict) else b[key]
        if not x or not y:
            return None
        return y / x if lower_is_better else x / y

    for conc in report["config"]["concurrency"]:
        for base in ("static", "llama.cpp"):
            for workload in report["config"]["workloads"]:
                ours, theirs = cell(report, "radixserve", workload, conc), cell(report, base, workload, conc)
                t, f = ratio(ours, theirs, "output_tokens_per_s"), ratio(ours, theirs, "ttft_s", True)
                if t is not None:
                    lines.append(f"{workload} c={conc} vs {base}: throughput {t:.2f}x, "
                                 f"TTFT p50 {f:.2f}x lower" if f else f"{workload} c={conc} vs {base}: throughput {t:.2f}x")
        for base in ("radixserve-no-radix", "radixserve-fcfs"):
            for workload in ("shared-prefix", "multi-turn"):
                t = ratio(cell(report, "radixserve", workload, conc), cell(report, base, workload, conc),
                          "output_tokens_per_s")
                if t is not None:
                    lines.append(f"{workload} c={conc} vs {base}: throughput {t:.2f}x")
    return lines


def table(report: dict) -> str:
    def ms(stat: dict) -> str:
        return "-" if stat.get("p50") is None else f"{stat['p50'] * 1000:.0f} / {stat['p99'] * 1000:.0f}"

    rows = ["| workload | conc | system | out tok/s | TTFT p50 / p99 ms | TPOT p50 ms | cached | valid JSON |",
            "|---|---:|---|---:|---:|---:|---:|---:|"]
    for workload in report["config"]["workloads"]:
        for conc in report["config"]["concurrency"]:
            for system in report["config"]["systems"]:
                r = cell(report, system, workload, conc)
                if r is None:
                    continue
                tpot = r["tpot_s"]["p50"]
                valid = f"{r['valid_json_share']:.0%}" if "valid_json_share" in r else ""
                fail = f" ({r['failed']} failed)" if r["failed"] else ""
                rows.append(f"| {workload} | {conc} | {system}{fail} | {r['output_tokens_per_s']:.0f} | {ms(r['ttft_s'])} "
                            f"| {'-' if tpot is None else f'{tpot * 1000:.0f}'} | {r['cached_token_ratio']:.0%} | {valid} |")
    m = report["machine"]
    head = (f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, no GPU. Model: {report['config']['model']}. "
            f"shared-prefix system prompts of {report['config'].get('prefix_words', 400)} words. "
            f"Each cell: closed-loop clients for {report['config']['duration']:g} s, max_tokens "
            f"{report['config']['max_tokens']}, temperature 0; every system gets the same prompts, each cell "
            f"new ones (seed {report['config']['seed']} + 1000 x cell). Servers stay up across cells, as in "
            f"production, after a short warm-up.\n\n")
    return head + "\n".join(rows) + "\n\n" + "\n".join(f"- {line}" for line in ratios(report)) + "\n"


def chart(report: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads, concs, names = report["config"]["workloads"], report["config"]["concurrency"], report["config"]["systems"]
    fig, axes = plt.subplots(2, len(workloads), figsize=(4.2 * len(workloads), 7), squeeze=False)
    width = 0.8 / max(1, len(names))
    for col, workload in enumerate(workloads):
        for row, (title, get) in enumerate((("output tokens/s", lambda r: r["output_tokens_per_s"]),
                                            ("TTFT p50 (s)", lambda r: r["ttft_s"]["p50"] or 0))):
            ax = axes[row][col]
            for i, name in enumerate(names):
                ys = [get(c) if (c := cell(report, name, workload, conc)) else 0 for conc in concs]
                ax.bar([x + i * width for x in range(len(concs))], ys, width=width, label=name)
            ax.set_xticks([x + 0.4 - width / 2 for x in range(len(concs))], [f"c={c}" for c in concs])
            ax.set_title(f"{workload}: {title}", fontsize=10)
            if row == 1 and workload != "shared-prefix":
                ax.set_yscale("log")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--systems", nargs="+", default=None, help="default: all (llama.cpp only if built)")
    p.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--duration", type=float, default=20.0, help="seconds each cell starts requests")
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prefix-words", type=int, default=400, help="shared-prefix: words per system prompt")
    p.add_argument("--model", default=None, help="GGUF file (default: the embedded model)")
    p.add_argument("--port", type=int, default=8300)
    p.add_argument("--out", default=str(BENCH / "results" / "compare.json"))
    p.add_argument("--merge", action="store_true",
                   help="keep the other systems' results already in --out (rerun some systems only)")
    args = p.parse_args(argv)

    from radixserve.runtime.models.loader import default_model_path
    model = args.model or str(default_model_path())
    available = systems(sys.executable)
    if args.systems is None:
        args.systems = [s.name for s in available if s.name != "llama.cpp" or LLAMA_SERVER.exists()]
        if not LLAMA_SERVER.exists():
            print("llama.cpp: not built (make bench-peers builds it); skipped", flush=True)
    chosen = [s for s in available if s.name in args.systems]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "machine": machine(),
        "config": {"systems": [s.name for s in chosen], "workloads": args.workloads, "concurrency": args.concurrency,
                   "duration": args.duration, "max_tokens": args.max_tokens, "seed": args.seed,
                   "prefix_words": args.prefix_words,
                   "model": Path(model).name, "command": "bench/compare.py " + " ".join(argv or sys.argv[1:])},
        "systems": {s.name: s.description for s in chosen},
        "results": {},
    }
    if args.merge and out.exists():
        old = json.loads(out.read_text())
        kept = [n for n in old["config"]["systems"] if n not in report["config"]["systems"]]
        report["results"] = {n: old["results"][n] for n in kept if n in old["results"]}
        report["systems"] = {**{n: old["systems"][n] for n in kept}, **report["systems"]}
        order = [s.name for s in available]
        report["config"]["systems"] = sorted(kept + report["config"]["systems"], key=order.index)
        report["config"]["command"] = old["config"]["command"] + " ; " + report["config"]["command"]
    for system in chosen:
        workloads = [w for w in args.workloads if w in system.workloads]
        if not workloads:
            continue
        log = out.parent / f"compare-{system.name}.log"
        print(f"== {system.name}: starting", flush=True)
        proc = start(system, args.port, model, log)
        try:
            base_url = f"http://127.0.0.1:{args.port}/v1"
            # first requests pay one-off costs (kernel selection, allocator growth) on every system
            run_workload(base_url, "random", 4, args, seed=10_000, duration=3, max_tokens=16)
            for workload in workloads:
                for i, conc in enumerate(args.concurrency):
                    # every system gets the same prompts in a cell, but each cell new ones: a cell
                    # must not find the previous cell's identical prompts already cached
                    r = run_workload(base_url, workload, conc, args, args.seed + 1000 * i, args.duration,
                                     args.max_tokens)
                    report["results"].setdefault(system.name, {}).setdefault(workload, {})[str(conc)] = r
                    print(f"{system.name:>20} {workload:>13} c={conc:<3} {r['completed']:>4} ok "
                          f"{r['output_tokens_per_s']:7.1f} tok/s  TTFT p50 {serving._fmt(r['ttft_s']['p50'])}  "
                          f"cached {r['cached_token_ratio']:.0%}"
                          + (f"  valid {r['valid_json_share']:.0%}" if "valid_json_share" in r else ""), flush=True)
                    out.write_text(json.dumps(report, indent=2) + "\n")  # partial results survive a crash
        finally:
            stop(proc)
    out.write_text(json.dumps(report, indent=2) + "\n")
    out.with_suffix(".md").write_text(table(report))
    chart(report, out.with_suffix(".png"))
    print(table(report))
    print(f"wrote {out}, {out.with_suffix('.md')}, {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
