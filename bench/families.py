"""Decode speed of each model family (issue 34's figure), without a server: one request, greedy,
its decode steps timed less the first (the prompt's last token).

- every family's tiny random config (tests/tiny_models.py: hidden 64, two layers), where per-step
  overhead is all there is to see;
- a Qwen3-MoE-shaped model of ~1B total parameters (48 experts of 384, top 4, 16 layers, hidden
  1024) beside the dense model of the same active size (one MLP of 4 x 384): a MoE step should
  cost close to its active parameters, not its total. Rounds alternate between the two. `moe`
  serves them as bf16 safetensors; `moe-gguf` as Q8_0 GGUFs in llama.cpp's layout, whose
  experts run on the block kernels. `--forms fused separate` times each model of the pair both
  ways, alternating: its layers in one kernel call each (runtime/models/fused_decode.py; a MoE
  layer's experts a call of their own) and as separate calls.

- `windows`: a Gemma-3-shaped model (hidden 1024, 12 layers, 5 of 6 windowed to 512 tokens) at
  ~3,000 tokens of context, its decode attention on the C++ kernels (`cpu`: the windowed layers read
  their last 512 positions) against the torch backend, alternating.

Every timing runs in a child process of its own, one engine in it. Two OpenMP thread pools in one
process (a second engine's, or the main thread's after any parallel torch op) make libgomp see
more threads than cores, and its barriers then sleep at once instead of spinning: a fused decode
step of the ~1B MoE took 21 ms instead of 9 that way, after a 1 MB torch.zeros in the main thread.

Random weights written with transformers' own classes into a temporary directory; nothing is
downloaded. Writes bench/results/families.json (or --out). Reports figures, never asserts.

    .venv/bin/python bench/families.py [--rounds 3] [--steps 48] [--parts tiny,moe,moe-gguf,windows]
    .venv/bin/python bench/families.py --parts moe-gguf --forms fused separate
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))   # after site-packages: the checkout's kernels/ must not shadow HF's `kernels`

import torch  # noqa: E402

from compare import machine  # noqa: E402  (bench/, beside this script)
from radixserve.runtime.config import EngineConfig  # noqa: E402
from radixserve.runtime.engine import Engine  # noqa: E402
from radixserve.runtime.models.loader import load_model_files  # noqa: E402
from radixserve.runtime.sampling_params import SamplingParams  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "families.json"
TINY = ["llama", "qwen3", "phi4_mini", "mixtral", "qwen3_moe", "gemma3", "gpt_oss"]
PROMPT = [5, 17, 923, 4000, 12, 88, 3021, 7, 7, 101, 4522, 39] * 8


def moe_pair() -> dict:
    """~1B total Qwen3-MoE and its dense twin of the same active size."""
    import transformers as tf

    common = dict(vocab_size=49152, hidden_size=1024, num_hidden_layers=16, num_attention_heads=16,
                  num_key_value_heads=4, head_dim=64, max_position_embeddings=4096, tie_word_embeddings=False)
    return {"qwen3_moe_1b": tf.Qwen3MoeConfig(**common, num_experts=48, num_experts_per_tok=4,
                                              moe_intermediate_size=384, intermediate_size=1536),
            "dense_same_active": tf.Qwen3Config(**common, intermediate_size=4 * 384)}


def write_model(cfg, directory: Path, tokenizer, gguf: bool = False) -> tuple[Path, int]:
    """A random model of `cfg` saved as transformers saves it, or as a Q8_0 GGUF; its path and
    parameter count."""
    import transformers as tf

    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32 if gguf else torch.bfloat16)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02) if p.dim() > 1 else p.fill_(1.0)
    count = sum(p.numel() for p in model.parameters())
    if gguf:
        from tests.gguf_export import write_llama_gguf

        return write_llama_gguf(model, directory.with_suffix(".gguf"), None, quant="Q8_0"), count
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save(directory)
    return directory, count


def active_params(cfg) -> int:
    """Parameters a token reads: all but the unchosen experts (and the embedding table's other rows)."""
    h, layers = cfg.hidden_size, cfg.num_hidden_layers
    heads, kv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    attention = h * heads * d * 2 + h * kv * d * 2
    experts = getattr(cfg, "num_experts", 0)
    mlp = (3 * h * cfg.moe_intermediate_size * cfg.num_experts_per_tok + h * experts) if experts else 3 * h * cfg.intermediate_size
    return layers * (attention + mlp) + cfg.vocab_size * h


def windowed_gemma3():
    import transformers as tf

    return tf.Gemma3TextConfig(vocab_size=49152, hidden_size=1024, intermediate_size=4096, num_hidden_layers=12,
                               num_attention_heads=8, num_key_value_heads=4, head_dim=128, sliding_window=512,
                               max_position_embeddings=8192, tie_word_embeddings=True)


def tpot_ms(engine: Engine, steps: int, prompt: list[int] = PROMPT) -> float:
    engine.generate([prompt], SamplingParams(max_tokens=1, temperature=0.0))   # warm, and cache the prompt
    start = time.perf_counter()
    engine.generate([prompt], SamplingParams(max_tokens=1, temperature=0.0))
    first = time.perf_counter() - start
    before, start = engine.steps, time.perf_counter()
    engine.generate([prompt], SamplingParams(max_tokens=steps, temperature=0.0, ignore_eos=True))
    ms = (time.perf_counter() - start - first) / (engine.steps - before - 1) * 1e3
    engine.flush_cache()
    return ms


def spread(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 2), "min": round(min(values), 2), "max": round(max(values), 2)}


LONG_PROMPT = [200 + (i * 7919) % 40000 for i in range(3000)]


def measure(path: Path, steps: int, form: str = "fused", backend: str = "auto", long: bool = False) -> dict:
    """One TPOT of the model at `path`, timed in a child process that holds only its engine."""
    cmd = [sys.executable, __file__, "--measure", str(path), "--steps", str(steps), "--form", form,
           "--backend", backend] + (["--long-prompt"] if long else [])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def measure_here(args) -> None:
    engine = Engine(EngineConfig(kv_cache_tokens=8192, attention_backend=args.backend),
                    model_files=load_model_files(args.measure))
    fused = engine.model.fused_decode
    engine.model.fused_decode = fused if args.form == "fused" else None
    ms = tpot_ms(engine, args.steps, LONG_PROMPT if args.long_prompt else PROMPT)
    print(json.dumps({"tpot_ms": ms, "dtype": str(engine.dtype), "fused_available": fused is not None}))
    engine.shutdown()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=48)
    p.add_argument("--parts", default="tiny,moe")
    p.add_argument("--forms", nargs="+", default=["fused"], choices=["fused", "separate"],
                   help="the MoE pair's decode steps as fused layer calls (where the model has them) or separate ones")
    p.add_argument("--out", type=Path, default=RESULTS)
    # a child's one timing (measure())
    p.add_argument("--measure", help=argparse.SUPPRESS)
    p.add_argument("--form", default="fused", help=argparse.SUPPRESS)
    p.add_argument("--backend", default="auto", help=argparse.SUPPRESS)
    p.add_argument("--long-prompt", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.measure:
        return measure_here(args)
    parts = set(args.parts.split(","))
    tokenizer = load_model_files(None, weights=False).tokenizer
    report: dict = {"command": "bench/families.py " + " ".join(sys.argv[1:]), "machine": machine(),
                    "threads": torch.get_num_threads(), "tiny": {}}
    with tempfile.TemporaryDirectory() as tmp:
        if "tiny" in parts:
            from tests.tiny_models import build_tiny_model

            for arch in TINY:
                build_tiny_model(arch, Path(tmp) / arch, tokenizer)
                ms = [measure(Path(tmp) / arch, args.steps)["tpot_ms"] for _ in range(args.rounds)]
                report["tiny"][arch] = {"tpot_ms": spread(ms), "tok_per_s": round(1e3 / statistics.median(ms), 1)}
                print(arch, report["tiny"][arch], flush=True)
        for part in ("moe", "moe-gguf"):
            if part not in parts:
                continue
            paths, sizes = {}, {}
            for name, cfg in moe_pair().items():
                path, total = write_model(cfg, Path(tmp) / name, tokenizer, gguf=part == "moe-gguf")
                paths[name] = path
                sizes[name] = {"total_params_m": round(total / 1e6), "active_params_m": round(active_params(cfg) / 1e6),
                               "file_mb": round(sum(f.stat().st_size for f in ([path] if path.is_file() else path.iterdir())) / 2**20)}
            runs = [(name, form) for form in args.forms for name in paths]
            ms: dict[tuple, list[float]] = {run: [] for run in runs}
            for r in range(args.rounds):
                for name, form in (runs if r % 2 == 0 else list(reversed(runs))):
                    got = measure(paths[name], args.steps, form)
                    sizes[name].update(dtype=got["dtype"], fused_available=got["fused_available"])
                    ms[name, form].append(got["tpot_ms"])
                    print(name, form, r, round(ms[name, form][-1], 2), flush=True)
            key = part.replace("-", "_")
            report[key] = {}
            for name in paths:
                report[key][name] = dict(sizes[name])
                for form in args.forms:
                    report[key][name][form] = {"tpot_ms": spread(ms[name, form]),
                                               "tok_per_s": round(1e3 / statistics.median(ms[name, form]), 1)}
            for form in args.forms:
                moe, dense = (statistics.median(ms[n, form]) for n in paths)
                report[key][f"moe_over_dense_tpot_{form}"] = round(moe / dense, 2)
        if "windows" in parts:
            path, _ = write_model(windowed_gemma3(), Path(tmp) / "gemma3_windowed", tokenizer)
            ms = {b: [] for b in ("cpu", "torch")}
            for r in range(args.rounds):
                for b in (list(ms) if r % 2 == 0 else list(reversed(ms))):
                    ms[b].append(measure(path, args.steps, backend=b, long=True)["tpot_ms"])
                    print("windows", b, r, round(ms[b][-1], 2), flush=True)
            report["windows"] = {b: {"tpot_ms": spread(ms[b])} for b in ms}
            report["windows"]["cpu_over_torch_tpot"] = round(statistics.median(ms["cpu"]) / statistics.median(ms["torch"]), 2)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
