"""The engine's decode step for the shapes of bench/single_stream.py (one request at ~130 and ~3,000
tokens of context, 8 requests at ~3,000), without a server: each shape's prompts are cached first,
then a run of greedy decode steps is timed, less its first step (the prompts' last token).

`--forms fused layers separate` alternates, shape by shape, the engine as it runs (a pure-decode
step of a float32 model on block weights in one kernel call: embedding, decoder layers, final norm
and LM head, runtime/models/fused_decode.py), the layers in that call but the ends (embedding,
norm, head) as calls of their own ("layers"), each layer's ops as separate calls, and the engine as
it runs with its GGUF weights left in the file's memory map ("mmap": 4 KiB pages, where the engine
moves them to huge pages; one engine lives at a time, rebuilt when the form changes). The ratio
to the floor comes from
bench/results/decode_floor.json when bench/decode_floor.py has written it.

    .venv/bin/python bench/decode_step.py                        # 5 repeats of each shape
    .venv/bin/python bench/decode_step.py --forms fused layers separate --repeats 4
    .venv/bin/python bench/decode_step.py --shapes 1x130 32x130 --json bench/results/decode_step_b1_b32.json
    .venv/bin/python bench/decode_step.py --model bench/models/llama-1b-Q4_K_M.gguf --shapes 1x130
    .venv/bin/python bench/decode_step.py --model bench/models/llama-1b-Q4_K_M.gguf --shapes 1x130 --forms fused mmap
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from radixserve.runtime.config import EngineConfig  # noqa: E402
from radixserve.runtime.engine import Engine  # noqa: E402
from radixserve.runtime.models.loader import load_model_files  # noqa: E402
from radixserve.runtime.sampling_params import SamplingParams  # noqa: E402

RESULTS = Path(__file__).parent / "results"
SHAPES = ((1, 130), (1, 3000), (8, 3000))


def step_ms(engine: Engine, batch: int, context: int, steps: int, seed: int) -> float:
    rng = random.Random(seed)
    prompts = [[rng.randrange(200, 40000) for _ in range(context)] for _ in range(batch)]
    engine.generate(prompts, SamplingParams(max_tokens=1, temperature=0.0))   # cache the prompts
    start = time.perf_counter()
    engine.generate(prompts, SamplingParams(max_tokens=1, temperature=0.0))   # their last token only
    first = time.perf_counter() - start
    steps_before, start = engine.steps, time.perf_counter()
    engine.generate(prompts, SamplingParams(max_tokens=steps, temperature=0.0, ignore_eos=True))
    ms = (time.perf_counter() - start - first) / (engine.steps - steps_before - 1) * 1e3
    engine.flush_cache()
    return ms


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--forms", nargs="+", default=["fused"], choices=["fused", "layers", "separate", "mmap"])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=48)
    p.add_argument("--shapes", nargs="+", default=[f"{b}x{c}" for b, c in SHAPES],
                   help="requests x context tokens, e.g. 1x130 32x130")
    p.add_argument("--json", type=Path, default=RESULTS / "decode_step.json")
    p.add_argument("--model", default=None, help="a GGUF file or HF directory (default: the embedded model)")
    args = p.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes]

    def start(mmap: bool) -> Engine:
        engine = Engine(EngineConfig(kv_cache_tokens=65536, max_running_requests=64, mmap=mmap),
                        model_files=load_model_files(args.model))
        if engine.weight_pages is not None:   # the move to huge pages, before anything is timed
            engine.weight_pages.join()
        step_ms(engine, 1, 50, 8, 0)   # warm-up
        return engine

    engine = start(mmap=False)
    fused = engine.model.fused_decode
    ends = fused.ends if fused is not None else None
    floors = {}
    if (RESULTS / "decode_floor.json").exists():   # the floor of the same model only
        floor_report = json.loads((RESULTS / "decode_floor.json").read_text())
        if floor_report.get("model") == args.model:
            floors = {k: v["floor_ms"] for k, v in floor_report["shapes"].items()}
    times: dict[tuple[str, str], list[float]] = {}
    try:
        for rep in range(args.repeats):
            for batch, context in shapes:
                for form in args.forms if rep % 2 == 0 else args.forms[::-1]:
                    if engine.config.mmap != (form == "mmap"):   # one engine (one OpenMP team) at a time
                        engine.shutdown()
                        engine = start(mmap=form == "mmap")
                        fused = engine.model.fused_decode
                        ends = fused.ends if fused is not None else None
                    engine.model.fused_decode = None if form == "separate" else fused
                    if fused is not None:
                        fused.ends = ends if form in ("fused", "mmap") else None
                    ms = step_ms(engine, batch, context, args.steps, 1000 * rep + batch + context)
                    times.setdefault((form, f"{batch}x{context}"), []).append(ms)
                    print(f"repeat {rep} {form:8} {batch}x{context}: {ms:6.2f} ms", flush=True)
    finally:
        engine.shutdown()
    print(f"\nform     shape    median ms (min-max)   / floor   (fused available: {fused is not None})")
    report = {}
    for (form, shape), ts in times.items():
        med = statistics.median(ts)
        floor = floors.get(shape)
        ratio = f"{med / floor:5.2f}x" if floor else "   -"
        print(f"{form:8} {shape:8} {med:7.2f} ({min(ts):.2f}-{max(ts):.2f})   {ratio}")
        report.setdefault(form, {})[shape] = {"median_ms": med, "min_ms": min(ts), "max_ms": max(ts), "runs": ts,
                                              "floor_ms": floor}
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    print("wrote", args.json)


if __name__ == "__main__":
    main()
