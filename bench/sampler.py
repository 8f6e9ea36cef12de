"""Sampler time on CPU: one `Sampler.sample` call on random float32 logits, 32 rows x 49,152 (the
default model's vocabulary), no model.

Two batches: "mixed" (8 greedy rows; 8 temperature + top_p; 8 seeded top_k + min_p; 8 sampled rows
with repetition / frequency / presence penalties over ~300 prior tokens; every fourth row asks for
logprobs=5) and "greedy" (all 32 rows greedy: the argmax fast path).
--cold-mb N streams N MB through the caches before each timed call, as a decode step's weights do
before the sampler runs; --argmax torch times the torch-ops argmax in place of the CPU kernels'.
With --baseline FILE (a sampler.py, e.g. `git show <rev>:runtime/sampler.py > /tmp/old.py`), that
module's Sampler is timed too, taking turns with ours call by call, so slow spells of this machine
hit both alike. Each cell: the median of --repeats calls per run (10x for the sub-millisecond
greedy batch), then the median of --runs runs (their range in brackets). Never asserts a time.

    .venv/bin/python bench/sampler.py [--baseline FILE] [--rows 32] [--vocab 49152] [--runs 5]
        [--repeats 50] [--threads 0] [--cold-mb 0] [--argmax kernels|torch] [--json bench/results/sampler.json]
    .venv/bin/python bench/sampler.py --rows 1 --cold-mb 96 --repeats 20    # one request after a 1B step
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import random
import time
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch

# what the engine does to malloc at start, so that multi-MB temporaries do not fault in pages each step
from radixserve.runtime.cpu_tuning import retain_freed_memory
from radixserve.runtime.request import OutputStream, Request
from radixserve.kernels.sampling import argmax_rows_torch
from radixserve.runtime import sampler as sampler_module
from radixserve.runtime.sampler import Sampler
from radixserve.runtime.sampling_params import SamplingParams

EOS = [0]


def load_sampler(path: str) -> type:
    spec = importlib.util.spec_from_file_location("baseline_sampler", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Sampler


def make_requests(rows: int, vocab: int, mixed: bool) -> list[Request]:
    rng = random.Random(0)
    reqs = []
    for i in range(rows):
        group = i * 4 // rows if mixed else 0
        kw: dict = [dict(temperature=0.0),
                    dict(temperature=0.8, top_p=0.9),
                    dict(temperature=1.0, top_k=50, min_p=0.05, seed=1000 + i),
                    dict(temperature=0.7, repetition_penalty=1.1, frequency_penalty=0.3, presence_penalty=0.2)][group]
        if mixed and i % 4 == 0:
            kw["logprobs"] = 5
        prompt = [rng.randrange(vocab) for _ in range(200 if group == 3 else 20)]
        r = Request(f"r{i}", prompt, SamplingParams(max_tokens=1000, **kw), OutputStream(f"r{i}"))
        for _ in range(100 if group == 3 else 5):
            r.append_token(rng.randrange(vocab))
        # what a sampler from before counter-based noise reads (a --baseline one)
        r.generator = torch.Generator().manual_seed(r.params.seed) if r.params.seed is not None else None
        reqs.append(r)
    return reqs


def median_ms(fns: dict[str, Callable[[torch.Tensor], object]], base: torch.Tensor, repeats: int,
              flush: Optional[np.ndarray] = None) -> dict[str, float]:
    """Median time of each fn(logits) on a fresh copy of `base`, the fns taking turns call by call
    (who goes first alternating too): a fn timed right after another ran measurably faster here.
    `flush`: read whole before each call (numpy's code, not the sampler's, runs warm)."""
    logits = base.clone()
    names = list(fns)
    for _ in range(5):
        for name in names:
            logits.copy_(base)
            fns[name](logits)
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(repeats):
        for name in (names if i % 2 == 0 else names[::-1]):
            logits.copy_(base)  # the sampler writes its logits
            if flush is not None:
                flush.sum()
            start = time.perf_counter()
            fns[name](logits)
            times[name].append(time.perf_counter() - start)
    return {name: sorted(t)[len(t) // 2] * 1e3 for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--baseline", help="a sampler.py to time beside runtime/sampler.py")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave torch's default)")
    parser.add_argument("--repeats", type=int, default=50, help="calls timed per cell and run")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--cold-mb", type=int, default=0, help="MB streamed through the caches before each call")
    parser.add_argument("--argmax", choices=["kernels", "torch"], default="kernels",
                        help="the greedy rows' argmax: the CPU kernels' (where built) or torch ops")
    parser.add_argument("--json", default=str(Path(__file__).parent / "results" / "sampler.json"))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    retain_freed_memory()
    if args.argmax == "torch":
        sampler_module.argmax_rows = argmax_rows_torch
    flush = np.ones(args.cold_mb << 18, dtype=np.int32) if args.cold_mb else None

    samplers = {"ours": Sampler}
    if args.baseline:
        samplers["baseline"] = load_sampler(args.baseline)
    batches = {"mixed": make_requests(args.rows, args.vocab, mixed=True),
               "greedy": make_requests(args.rows, args.vocab, mixed=False)}
    base = torch.randn(args.rows, args.vocab, generator=torch.Generator().manual_seed(0)) * 3
    runs: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.runs):
        for batch, reqs in batches.items():
            fns = {name: (lambda x, s=cls(args.vocab, EOS, seed=0), r=reqs: s.sample(x, r))
                   for name, cls in samplers.items()}
            for name, ms in median_ms(fns, base, args.repeats * (10 if batch == "greedy" else 1), flush).items():
                runs.setdefault((batch, name), []).append(ms)

    print(f"{args.rows} rows x {args.vocab} float32 logits, torch {torch.__version__}, "
          f"{torch.get_num_threads()} thread(s); median ms of {args.repeats} calls (greedy: x10), "
          f"then the median of {args.runs} runs [range]")
    report = {"cold_mb": args.cold_mb, "argmax": args.argmax, "rows": args.rows, "vocab": args.vocab, "threads": torch.get_num_threads(), "torch": torch.__version__,
              "runs": args.runs, "repeats": args.repeats, "baseline": args.baseline, "median_ms": {}}
    for batch in batches:
        for name in samplers:
            values = sorted(runs[(batch, name)])
            med = values[len(values) // 2]
            print(f"{batch:7} {name:9} {med:8.3f} [{values[0]:.3f}-{values[-1]:.3f}]")
            report["median_ms"][f"{batch}/{name}"] = {"median": round(med, 4),
                                                     "runs": [round(v, 4) for v in runs[(batch, name)]]}
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
