"""The two ways a block-quantized linear layer runs on the CPU, side by side: the block kernels
(int8 activations, the weight read as the file holds it) and, where the CPU has AMX or AVX512-BF16,
weight panels dequantised to bf16 and multiplied by oneDNN's bf16 GEMM (runtime/models/linear.py).
Rows alternate between the two; each figure is the median of --repeats timings.

Matrices: the default model's MLP (Q4_1, 1536 x 576 and 576 x 1536), and 1B-shaped ones of
each block type made here (random weights, quantized with the gguf package's reference).

Writes bench/results/gemm.json (or --out). Reports figures, never asserts.

    .venv/bin/python bench/gemm.py [--rows 1 4 16 32 64 128 512] [--repeats 7]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.append(str(Path(__file__).resolve().parent.parent))   # tests/, after site-packages

import numpy as np  # noqa: E402
import torch  # noqa: E402

from compare import machine  # noqa: E402  (bench/, beside this script)
from radixserve.runtime.models.linear import BlockLinear  # noqa: E402
from radixserve.runtime.models.loader import load_model_files  # noqa: E402
from radixserve.runtime.models.quant import BlockTensor  # noqa: E402,F401
from radixserve.runtime.platform import get_platform  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "gemm.json"


def made_matrix(kind: str, rows: int, cols: int) -> BlockTensor:
    """Random weights in `kind` (the K-quants by the tests' own quantiser: the gguf package has none)."""
    from tests.kquants import quantized

    return quantized(kind, np.random.default_rng(0).normal(0, 0.02, (rows, cols)).astype(np.float32))


def timed(f, repeats: int) -> float:
    f()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 32, 64, 128, 512])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    cpu = get_platform(torch.device("cpu"))
    kernels = cpu.kernels()
    files = load_model_files(None)
    matrices = {"smollm2 gate (Q4_1 1536x576)": files.weights["model.layers.0.mlp.gate_proj.weight"],
                "smollm2 down (Q4_1 576x1536)": files.weights["model.layers.0.mlp.down_proj.weight"],
                "1B up (Q4_K 8192x2048)": made_matrix("Q4_K", 8192, 2048),
                "1B down (Q6_K 2048x8192)": made_matrix("Q6_K", 2048, 8192),
                "1B qkv (Q8_0 3072x2048)": made_matrix("Q8_0", 3072, 2048)}
    report = {"command": "bench/gemm.py " + " ".join(sys.argv[1:]), "machine": machine(),
              "bf16_gemm_available": cpu.fast_bf16 and cpu.onednn_bf16, "matrices": {}}
    for name, w in matrices.items():
        lin = BlockLinear([w], None, kernels, bf16_gemm=True)
        rows = {}
        for n in args.rows:
            x = torch.randn(n, w.cols)
            blocks = timed(lambda: kernels.block_linear(x, lin.matrix), args.repeats)
            panels = timed(lambda: lin._bf16_panels(x), args.repeats)
            flop = 2 * w.rows * w.cols * n
            rows[n] = {"block_kernels_gflops": round(flop / blocks / 1e9, 1), "bf16_panels_gflops": round(flop / panels / 1e9, 1),
                       "panels_speedup": round(blocks / panels, 2)}
            print(name, n, rows[n], flush=True)
        report["matrices"][name] = rows
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
