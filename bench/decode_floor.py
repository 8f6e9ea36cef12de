"""Lower bounds for a decode step of the default model on this machine, from its parts alone.

A decode step must at least run every linear layer (and the LM head) on its batch and read the
K/V of every request's context once. This times the engine's own linear layers, in the dtype the
engine picks here (`runtime/models/llama.py`: a GGUF file's block-quantized matrices on the block
kernels at every batch size; dense ones in bf16 on a CPU with AVX512-BF16 or AMX, float32
elsewhere), without anything else of a step,
measures memory bandwidth and a large bf16 matmul, and adds them up for batch 1 / 8 / 32 at 300
tokens of context (bench/offline.py's decode-step setting) and for the shapes of
bench/single_stream.py: one request at ~130 and ~3,000 tokens, 8 requests at ~3,000. Compare with
the decode steps bench/offline.py measures. Writes bench/results/decode_floor.json.

    .venv/bin/python bench/decode_floor.py [--model bench/models/llama-8b-Q4_K_M.gguf --json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from radixserve.runtime.models.llama import LlamaForCausalLM  # noqa: E402
from radixserve.runtime.models.loader import load_model_files  # noqa: E402
from radixserve.runtime.cpu_tuning import cpu_flags  # noqa: E402
from radixserve.runtime.models.quant import BlockTensor  # noqa: E402
from radixserve.runtime.platform import get_platform, pick_dtype  # noqa: E402

# (batch, tokens of context per request)
SHAPES = ((1, 300), (8, 300), (32, 300), (1, 130), (1, 3000), (8, 3000))


def median_s(fn, repeats: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def memory_gb_per_s() -> dict:
    x = torch.randn(64 * 1024 * 1024)  # 256 MiB: far beyond the caches
    y = torch.empty_like(x)
    read = x.numel() * 4 / median_s(x.sum, 10)
    copy = 2 * x.numel() * 4 / median_s(lambda: y.copy_(x), 10)
    return {"read": read / 1e9, "copy_read_plus_write": copy / 1e9}


def bf16_matmul_tflops(n: int = 2048) -> float:
    a, b = torch.randn(n, n).to(torch.bfloat16), torch.randn(n, n).to(torch.bfloat16)
    return 2 * n ** 3 / median_s(lambda: a @ b, 10) / 1e12


def linear_layers_ms(model: LlamaForCausalLM, tokens: int) -> float:
    """Every projection of every layer plus the LM head, in the forms the engine picks for `tokens`."""
    cfg = model.cfg
    x = torch.randn(tokens, cfg.hidden_size).to(model.dtype)
    h = torch.randn(tokens, cfg.intermediate_size).to(model.dtype)

    def run():
        for layer in model.layers:
            layer.qkv(x), layer.o(x), layer.gate_up(x), layer.down(h)
        model.lm_head(x)
    return median_s(run, 15) * 1e3


def kv_bytes(model: LlamaForCausalLM, batch: int, context: int) -> int:
    cfg = model.cfg
    per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * torch.finfo(model.dtype).bits // 8
    return batch * context * per_token


def weight_bytes(files) -> int:
    """Bytes a decode step must read of the weights: every matrix once (a tied embedding once, as the LM head)."""
    return sum(w.nbytes for name, w in files.weights.items() if name != "model.embed_tokens.weight"
               or files.config.tie_word_embeddings or "lm_head.weight" not in files.weights)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="a GGUF file or HF directory (default: the embedded model)")
    ap.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "decode_floor.json")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    files = load_model_files(args.model)
    if files.mapped is not None:   # where the CPU engine streams a GGUF's weights from
        files.mapped.to_huge_pages()
    dtype = pick_dtype("auto", torch.device("cpu"),
                       block_quantized=any(isinstance(w, BlockTensor) for w in files.weights.values()))
    model = LlamaForCausalLM(files.config, files.weights, dtype, get_platform(torch.device("cpu")))
    flags = cpu_flags()
    report = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                         f"torch {torch.__version__}, {torch.get_num_threads()} threads",
              "amx_bf16": "amx_bf16" in flags, "avx512_bf16": "avx512_bf16" in flags,
              "memory_gb_per_s": memory_gb_per_s(),
              # without bf16 instructions a bf16 matmul is emulated: ~1 GFLOP/s, minutes at 2048^3
              "bf16_matmul_tflops_2048": bf16_matmul_tflops() if dtype == torch.bfloat16 else None,
              "dtype": str(dtype).removeprefix("torch."), "model": args.model or "default",
              "weight_bytes": weight_bytes(files), "shapes": {}}
    print(json.dumps({k: v for k, v in report.items() if k != "shapes"}, indent=1), flush=True)
    linear = {batch: linear_layers_ms(model, batch) for batch in sorted({b for b, _ in SHAPES})}
    # the weights' share of a one-token step against reading them at memory speed
    report["linear_gb_per_s_at_1"] = report["weight_bytes"] / (linear[1] / 1e3) / 1e9
    print(f"one token's linear layers: {linear[1]:.1f} ms, {report['linear_gb_per_s_at_1']:.1f} GB/s of weights "
          f"(memory reads {report['memory_gb_per_s']['read']:.1f} GB/s)", flush=True)
    for batch, context in SHAPES:
        kv_ms = kv_bytes(model, batch, context) / (report["memory_gb_per_s"]["read"] * 1e9) * 1e3
        report["shapes"][f"{batch}x{context}"] = {"batch": batch, "context": context,
                                                  "linear_layers_ms": linear[batch], "kv_read_once_ms": kv_ms,
                                                  "floor_ms": linear[batch] + kv_ms}
        print(f"batch {batch:2} x {context:4} tokens: linear layers + LM head {linear[batch]:6.1f} ms, "
              f"reading K/V once {kv_ms:5.1f} ms, floor {linear[batch] + kv_ms:6.1f} ms", flush=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print("wrote", args.json)


if __name__ == "__main__":
    main()
