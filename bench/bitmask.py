"""Bitmask apply time on CPU: 32 rows x 49,152 logits (the default model's vocab), per mask shape
and dtype, for our CPU path (kernels/cpu_kernels.cpp: what the engine runs), our eager torch path
(its fallback), the unpack-and-masked_fill reference and xgrammar's own CPU apply.
Prints a table (milliseconds: the median of --runs whole-table runs, each cell of a run the median
of --repeats calls); never asserts a time.

Mask shapes: "sparse" rows allow a handful of tokens (a JSON key or a number); "dense" rows allow
all but ~400 scattered tokens (inside a JSON string); "grammar" mixes both; "random" sets each bit
with p = 0.5 (the worst case for word-level tricks). "json-real" are masks xgrammar fills for the
default model's tokenizer while 32 matchers walk valid documents of bench/structured.py's 8
schemas (a batch per step, rows at different positions): what the engine applies in that
benchmark; its figure is the median over those batches.

    .venv/bin/python bench/bitmask.py [--rows 32] [--vocab 49152] [--threads 1] [--runs 5] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/structured.py's schemas

import torch  # noqa: E402

from radixserve.kernels import cpu_kernels  # noqa: E402
from radixserve.kernels.bitmask import (apply_token_bitmask_native, apply_token_bitmask_reference,  # noqa: E402
                                        apply_token_bitmask_torch, pack_bitmask)


def make_masks(rows: int, vocab: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    sparse = torch.zeros(rows, vocab, dtype=torch.bool)
    for r in range(rows):
        sparse[r, torch.randint(0, vocab, (int(torch.randint(2, 30, (1,), generator=gen)),), generator=gen)] = True
    dense = torch.ones(rows, vocab, dtype=torch.bool)
    for r in range(rows):
        dense[r, torch.randint(0, vocab, (400,), generator=gen)] = False
    grammar = torch.where(torch.arange(rows).unsqueeze(1) % 3 == 0, dense, sparse)
    random = torch.rand(rows, vocab, generator=gen) < 0.5
    return {name: pack_bitmask(m) for name, m in
            (("sparse", sparse), ("dense", dense), ("grammar", grammar), ("random", random))}


def json_schema_masks(rows: int, steps: int = 32) -> list[torch.Tensor]:
    """Bitmasks of `rows` xgrammar matchers walking valid documents of bench/structured.py's
    schemas (row i: schema i % 8, starting i tokens into its document), one batch per step."""
    from radixserve.grammar import GrammarSpec, make_grammar_backend
    from radixserve.runtime.models.loader import load_model_files
    from structured import make_schemas

    files = load_model_files(None)
    backend = make_grammar_backend("xgrammar", files.tokenizer.vocab_info(files.config.vocab_size))
    schemas = make_schemas()
    items = [lambda k: f"entry-number-{k:05d}", lambda k: 1000 + 37 * k,
             lambda k: {"name": f"person{k % 97}", "age": k % 90}, lambda k: ["alpha", "beta", "gamma", "delta"][k % 4]]
    walks = []
    for i in range(rows):
        doc = {"title": f"Catalogue {i}", "entries": [items[i % 4](k) for k in range(70)]}
        tokens = files.tokenizer.encode(json.dumps(doc, separators=(",", ":")), add_special_tokens=False)
        matcher = backend.matcher(backend.compile(GrammarSpec.json_schema(schemas[i % len(schemas)])))
        for t in tokens[:i]:
            assert matcher.accept_token(t)
        walks.append((matcher, tokens[i:]))
    masks = []
    for step in range(steps):
        bitmask = backend.allocate_bitmask(rows)
        backend.fill_bitmask([m for m, _ in walks], bitmask, list(range(rows)))
        masks.append(bitmask)
        for matcher, tokens in walks:
            assert matcher.accept_token(tokens[step])
    return masks


def median_ms(fn, masks: list[torch.Tensor], base: torch.Tensor, repeats: int) -> float:
    """Median time of fn(logits, mask) on a fresh copy of `base`, cycling through `masks`."""
    logits = base.clone()
    for i in range(50):  # the first calls after a switch of function or tensors run slow
        fn(logits, masks[i % len(masks)])
    times = []
    for i in range(repeats):
        logits.copy_(base)
        mask = masks[i % len(masks)]
        start = time.perf_counter()
        fn(logits, mask)
        times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2] * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave torch's default)")
    parser.add_argument("--repeats", type=int, default=200, help="calls timed per cell and run")
    parser.add_argument("--runs", type=int, default=5, help="whole tables measured; each cell reports their median")
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        import xgrammar
        xgr_apply = lambda x, m: xgrammar.apply_token_bitmask_inplace(x, m)  # noqa: E731
    except ImportError:
        xgr_apply = None

    gen = torch.Generator().manual_seed(0)
    masks = {name: [m] for name, m in make_masks(args.rows, args.vocab, gen).items()}
    if args.vocab == 49152:  # the default model's vocabulary: real grammar masks fit
        masks["json-real"] = json_schema_masks(args.rows)
    if cpu_kernels.load() is None:
        sys.exit("the CPU kernels are not built here: the native column would time the eager fallback")
    print(f"{args.rows} rows x {args.vocab} logits, torch {torch.__version__}, "
          f"{torch.get_num_threads()} thread(s); median ms of {args.repeats} calls, "
          f"then the median of {args.runs} runs (their range in brackets)")
    columns = {"native": (apply_token_bitmask_native, args.repeats),
               "eager": (apply_token_bitmask_torch, args.repeats),
               "reference": (apply_token_bitmask_reference, max(10, args.repeats // 20)),
               "xgrammar": (xgr_apply, max(10, args.repeats // 5))}
    bases = {dtype: torch.randn(args.rows, args.vocab, generator=gen).to(dtype)
             for dtype in (torch.float32, torch.bfloat16)}
    # whole tables, one after another: this machine has slow spells of a few seconds, and they
    # should hit one run of every cell rather than all runs of a few cells
    runs: dict[tuple[str, torch.dtype, str], list[float]] = {}
    for _ in range(args.runs):
        for dtype, base in bases.items():
            for name, mask_set in masks.items():
                for column, (fn, repeats) in columns.items():
                    ms = median_ms(fn, mask_set, base, repeats) if fn else float("nan")
                    runs.setdefault((name, dtype, column), []).append(ms)
        fill = median_ms(lambda x, _: x.fill_(float("-inf")), [None], bases[torch.float32], args.repeats)
        runs.setdefault(("fill", torch.float32, "floor"), []).append(fill)

    def cell(key: tuple) -> tuple[float, float, float]:
        values = sorted(runs[key])
        return values[len(values) // 2], values[0], values[-1]

    print(f"{'mask':9} {'dtype':9} " + " ".join(f"{c:>22}" for c in columns))
    report = {"rows": args.rows, "vocab": args.vocab, "threads": torch.get_num_threads(), "torch": torch.__version__,
              "runs": args.runs, "repeats": args.repeats, "median_ms": []}
    for dtype in bases:
        dtype_name = str(dtype).removeprefix("torch.")
        for name in masks:
            cells = {column: cell((name, dtype, column)) for column in columns}
            print(f"{name:9} {dtype_name:9} " + " ".join(
                f"{f'{m:.3f} [{lo:.3f}-{hi:.3f}]':>22}" for m, lo, hi in cells.values()))
            report["median_ms"].append({"mask": name, "dtype": dtype_name,
                                        **{c: round(m, 4) for c, (m, _, _) in cells.items()},
                                        "native_runs": [round(v, 4) for v in runs[(name, dtype, "native")]]})
    # what one full write of the logits costs: the floor for any in-place mask of sparse rows
    fill, lo, hi = cell(("fill", torch.float32, "floor"))
    print(f"floor: logits.fill_(-inf) on the same tensor (fp32): {fill:.3f} [{lo:.3f}-{hi:.3f}] ms")
    report["fill_floor_ms"] = round(fill, 4)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
