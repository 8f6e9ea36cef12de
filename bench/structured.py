"""Structured-output cost: 32 concurrent requests, 128 output tokens each, on the default model.

(a) unconstrained, (b) all JSON-schema constrained over 8 distinct schemas, (c) half and half.
Reports output tokens/s of each (the median of --rounds alternating runs), per-step mask fill and
apply time, and the compile time of each schema cold and cached. The schemas force long outputs (arrays with many items), so every request
runs its full 128 tokens and the three runs do the same amount of decoding.
Writes bench/results/structured.json.

    .venv/bin/python bench/structured.py [--dtype auto] [--grammar-backend xgrammar] [--rounds 3]
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from radixserve.grammar import GrammarCompiler, GrammarSpec, make_grammar_backend  # noqa: E402
from radixserve.runtime.config import EngineConfig  # noqa: E402
from radixserve.runtime.engine import Engine  # noqa: E402
from radixserve.runtime.sampling_params import SamplingParams  # noqa: E402

N_REQUESTS, NEW_TOKENS = 32, 128


def make_schemas() -> list[dict]:
    """8 distinct schemas whose valid documents are all longer than NEW_TOKENS tokens."""
    item_kinds = [
        {"type": "string", "minLength": 8, "maxLength": 24},
        {"type": "integer", "minimum": 1000, "maximum": 999999},
        {"type": "object", "additionalProperties": False, "required": ["name", "age"],
         "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 99}}},
        {"enum": ["alpha", "beta", "gamma", "delta"]},
    ]
    schemas = []
    for i in range(8):
        schemas.append({
            "type": "object", "additionalProperties": False, "required": ["title", "entries"],
            "properties": {
                "title": {"type": "string", "maxLength": 20 + i},
                "entries": {"type": "array", "items": item_kinds[i % 4], "minItems": 60, "maxItems": 80},
            }})
    return schemas


def run(engine: Engine, prompts: list[str], params: list[SamplingParams]) -> dict:
    t0 = engine.structured.timings
    before = (t0.steps, t0.fill_s, t0.apply_s, t0.rows)
    steps0 = engine.steps
    t = time.perf_counter()
    results = engine.generate(prompts, params)
    elapsed = time.perf_counter() - t
    tm = engine.structured.timings
    mask_steps = tm.steps - before[0]
    out = sum(len(r.token_ids) for r in results)
    report = {"seconds": elapsed, "output_tokens": out, "output_tok_per_s": out / elapsed,
              "steps": engine.steps - steps0,
              "finish_reasons": sorted({r.finish_reason for r in results})}
    if mask_steps:
        report["mask_fill_ms_per_step"] = (tm.fill_s - before[1]) / mask_steps * 1000
        report["mask_apply_ms_per_step"] = (tm.apply_s - before[2]) / mask_steps * 1000
        report["constrained_rows_per_step"] = (tm.rows - before[3]) / mask_steps
    valid = 0
    for r, p in zip(results, params):
        if p.constraint is not None and r.finish_reason == "stop":
            json.loads(r.text)
            valid += 1
    report["constrained_finished_and_parsed"] = valid
    return report


def compile_times(engine: Engine, schemas: list[dict], backend_name: str) -> dict:
    vocab = engine.tokenizer.vocab_info(engine.model_config.vocab_size, extra_stop_ids=tuple(engine.eos_token_ids))
    compiler = GrammarCompiler(make_grammar_backend(backend_name, vocab))
    cold, cached = [], []
    try:
        for s in schemas:
            spec = GrammarSpec.json_schema(s)
            t = time.perf_counter()
            compiler.compile(spec)
            cold.append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            compiler.compile(GrammarSpec.json_schema(json.loads(json.dumps(s))))
            cached.append((time.perf_counter() - t) * 1000)
    finally:
        compiler.shutdown()
    return {"cold_ms": cold, "cached_ms": cached,
            "cold_ms_mean": sum(cold) / len(cold), "cached_ms_mean": sum(cached) / len(cached)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--grammar-backend", default="xgrammar")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each configuration, alternating")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "structured.json"))
    args = ap.parse_args()
    engine = Engine(EngineConfig(dtype=args.dtype, kv_cache_tokens=65536, max_running_requests=N_REQUESTS,
                                 grammar_backend=args.grammar_backend))
    schemas = make_schemas()
    tok = engine.tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": f"Write a JSON catalogue number {i}."}])
               for i in range(N_REQUESTS)]
    free = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)

    def constrained(i: int) -> SamplingParams:
        return SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0,
                              constraint=GrammarSpec.json_schema(schemas[i % len(schemas)]))

    report = {"model": engine.model_name, "dtype": str(engine.dtype).replace("torch.", ""),
              "grammar_backend": args.grammar_backend,
              "workload": f"{N_REQUESTS} concurrent requests x {NEW_TOKENS} output tokens, greedy"}
    try:
        report["compile"] = compile_times(engine, schemas, args.grammar_backend)
        print("compile", report["compile"], flush=True)
        engine.generate(prompts[:2], [constrained(0), free])  # warm-up (also compiles the grammar backend)
        runs = {"unconstrained": [free] * N_REQUESTS,
                "all_json_schema": [constrained(i) for i in range(N_REQUESTS)],
                "half_and_half": [constrained(i) if i % 2 else free for i in range(N_REQUESTS)]}
        results: dict[str, list[dict]] = {name: [] for name in runs}
        for round_ in range(args.rounds):  # the three alternate, so a noisy minute hits them all
            for name, params in runs.items():
                engine.flush_cache()
                results[name].append(run(engine, prompts, params))
                print(f"round {round_}", name, results[name][-1], flush=True)
        for name, rounds in results.items():  # the median round of each, with every round's figure
            report[name] = sorted(rounds, key=lambda r: r["output_tok_per_s"])[len(rounds) // 2]
            report[name]["output_tok_per_s_rounds"] = [r["output_tok_per_s"] for r in rounds]
    finally:
        engine.shutdown()
    report["constrained_vs_unconstrained"] = (report["all_json_schema"]["output_tok_per_s"]
                                              / report["unconstrained"]["output_tok_per_s"])
    print("ratio", round(report["constrained_vs_unconstrained"], 3))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
