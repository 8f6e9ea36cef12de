"""The ways a block-quantized linear layer runs on the CPU, side by side: the block kernels (int8
activations, the weight read as the file holds it); where the CPU has VNNI, the kernels' int8 GEMM
on repacked panels of the weight (block_gemm, widths that are multiples of 256); and weight panels
dequantised to bf16 and multiplied by oneDNN's bf16 GEMM (runtime/models/linear.py picks per
platform). Each figure is the median of --repeats timings.

Matrices: the default model's MLP (Q4_1, 1536 x 576 and 576 x 1536), 1B-shaped ones of each
block type and a gpt-oss-20b expert's gate and up in MXFP4 and Q4_0, made here (random weights,
quantized with the gguf package's reference).

With --interleave, the legacy types' two multi-row forms instead, side by side: the library as
built (activation rows interleaved by eight from 5 rows, ltile in kernels/cpu_kernels.cpp) and the
same source built with interleaving off (lrow's 1 x 4 tiles at every row count), alternating; each
row count also checks that both give the same bits. With
--kinterleave, the K-quants' tokens interleaved by eight (ktile) against one row by four (krow).
With --prefetch, one- and two-token rows asked for a group of blocks at a time (rows over 1 KB, as
built) against every row asked for at once (the earlier form), every block type. With --against
SRC, the library as built against another source of it built the same way (an earlier commit's:
`git show HEAD~1:kernels/cpu_kernels.cpp > /tmp/before.cpp`) whose structs still match
kernels/cpu_kernels.py's (the `identical` column says where they do not).
With --from-memory, each matrix is cycled through copies that together pass the last-level cache,
so that its bytes come from memory, as a decode step's do on a model of 1B parameters or more;
figures are then also given in GB/s of weights.

With --prefill, also an engine's prefill time (a prompt of each length, cache flushed, one token
out) on the default model or --model, with each prefill GEMM the CPU has and with none (the block
kernels), alternating.

Writes bench/results/gemm.json (or --out). Reports figures, never asserts.

    .venv/bin/python bench/gemm.py [--rows 1 4 16 32 64 128 512] [--repeats 7]
    .venv/bin/python bench/gemm.py --prefill 512 2000 [--model bench/models/llama-1b-Q8_0.gguf]
    .venv/bin/python bench/gemm.py --interleave --rows 4 5 8 16 32 --out bench/results/gemm_interleave.json
    .venv/bin/python bench/gemm.py --kinterleave --rows 4 5 8 16 64 --out bench/results/gemm_kinterleave.json
    .venv/bin/python bench/gemm.py --prefetch --from-memory --rows 1 2 --out bench/results/gemm_prefetch_zen4.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Optional

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.append(str(Path(__file__).resolve().parent.parent))   # tests/, after site-packages

import numpy as np  # noqa: E402
import torch  # noqa: E402

from compare import machine  # noqa: E402  (bench/, beside this script)
from decode_floor import median_s  # noqa: E402
from radixserve.runtime.models.linear import BlockLinear  # noqa: E402
from radixserve.runtime.models.loader import load_model_files  # noqa: E402
from radixserve.runtime.models.quant import BlockTensor  # noqa: E402
from radixserve.runtime.platform import get_platform  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "gemm.json"


def made_matrix(kind: str, rows: int, cols: int) -> BlockTensor:
    """Random weights in `kind` (the K-quants by the tests' own quantiser: the gguf package has none)."""
    from tests.kquants import quantized

    return quantized(kind, np.random.default_rng(0).normal(0, 0.02, (rows, cols)).astype(np.float32))


def prefill_times(model, lengths: list[int], repeats: int) -> dict:
    """Seconds to prefill a prompt (and sample one token) with each prefill GEMM the CPU has (the
    kernels' int8 one, oneDNN's bf16 one over dequantised panels) and with none (the block
    kernels), alternating."""
    from radixserve.runtime.config import EngineConfig
    from radixserve.runtime.engine import Engine
    from radixserve.runtime.cpu_tuning import cpu_flags
    from radixserve.runtime.models.linear import BF16_GEMM_ROWS, BF16_GEMM_ROWS_NO_AMX, INT8_GEMM_ROWS
    from radixserve.runtime.sampling_params import SamplingParams

    engine = Engine(EngineConfig(kv_cache_tokens=8192, model=model))
    linears = [lin for layer in engine.model.layers for lin in vars(layer).values() if isinstance(lin, BlockLinear)]
    cpu = engine.platform
    bf16_rows = BF16_GEMM_ROWS if "amx_bf16" in cpu_flags() else BF16_GEMM_ROWS_NO_AMX
    sides = {"off": []}   # the GEMMs each side offers the matrices: as the platform does, bf16 alone, none
    if cpu.kernels().int8_gemm:
        sides["int8"] = [("int8", INT8_GEMM_ROWS)] + ([("bf16", bf16_rows)] if cpu.fast_bf16 and cpu.onednn_bf16 else [])
    if cpu.fast_bf16 and cpu.onednn_bf16:
        sides["bf16"] = [("bf16", bf16_rows)]
    rng = np.random.default_rng(0)
    out: dict = {"model": model or "default", "platform_prefill_gemms": cpu.prefill_gemms}
    for n in lengths:
        prompt = rng.integers(200, 40000, n).tolist()
        times: dict[str, list[float]] = {side: [] for side in sides}
        for r in range(repeats):
            for side in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
                for lin in linears:
                    lin.choose(sides[side])
                engine.flush_cache()
                t = time.perf_counter()
                engine.generate([prompt], SamplingParams(max_tokens=1, temperature=0.0))
                times[side].append(time.perf_counter() - t)
        out[n] = {side: {"median_s": round(statistics.median(v), 3), "min_s": round(min(v), 3),
                         "max_s": round(max(v), 3)} for side, v in times.items()}
        for side in sides:
            if side != "off":
                out[n][f"{side}_speedup"] = round(out[n]["off"]["median_s"] / out[n][side]["median_s"], 2)
        print("prefill", n, out[n], flush=True)
    engine.shutdown()
    return out


# --interleave / --kinterleave: the library as built against the same source built with a flag that
# brings back the form it replaced: (flag, name of each side, block types compared)
VARIANTS = {"interleave": ("-DRS_INTERLEAVE_ROWS=1000000000", "interleaved", "lrow", ("Q4_0", "Q4_1", "Q8_0")),
            "kinterleave": ("-DRS_KINTERLEAVE_ROWS=1000000000", "kinterleaved", "krow", ("Q4_K", "Q5_K", "Q6_K")),
            "prefetch": ("-DRS_PREFETCH_BURST_BYTES=1000000000", "spread", "burst", None),
            "against": (None, "built", "against", None)}


# Bytes of copies a --from-memory matrix is cycled through: past any last-level cache here (32 MB)
FROM_MEMORY_BYTES = 384 << 20


def variant_compare(kernels, matrices: dict, rows: list[int], repeats: int, variant: str,
                    against: Optional[Path] = None, from_memory: bool = False) -> dict:
    """GFLOP/s of the library as built against the same source built with VARIANTS[variant]'s flag
    (or against another source, `against`), alternating, and whether both give the same bits."""
    import ctypes
    import tempfile

    from radixserve.kernels import cpu_kernels

    flag, built, other, kinds = VARIANTS[variant]
    with tempfile.TemporaryDirectory() as tmp:   # the loaded library outlives its file
        path = Path(tmp) / f"cpu_kernels_{other}.so"
        if against is not None:   # built as the library is: -march=native and all
            cpu_kernels.build(path, cpu_kernels.FLAGS, against)
        else:
            cpu_kernels.build(path, cpu_kernels.FLAGS + [flag])
        before = cpu_kernels.CpuKernels(ctypes.CDLL(str(path)))
    sides = {built: kernels, other: before}
    out: dict = {}
    for name, w in matrices.items():
        if kinds is not None and w.kind not in kinds:
            continue
        copies = [w] if not from_memory else \
            [dataclasses.replace(w, data=w.data.copy()) for _ in range(max(2, FROM_MEMORY_BYTES // w.data.nbytes))]
        lins = {side: [BlockLinear([c], None, k).matrix for c in copies] for side, k in sides.items()}
        out[name] = {}
        for n in rows:
            x = torch.randn(n, w.cols)
            same = torch.equal(*(sides[s].block_linear(x, lins[s][0]) for s in sides))
            times: dict[str, list[float]] = {s: [] for s in sides}

            def cycle(side: str) -> None:
                for m in lins[side]:
                    sides[side].block_linear(x, m)

            for r in range(repeats):
                for side in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
                    times[side].append(median_s(lambda: cycle(side), 1 if from_memory else 3, warmup=1) / len(copies))
            flop = 2 * w.rows * w.cols * n
            cell = {f"{s}_gflops": round(flop / statistics.median(t) / 1e9, 1) for s, t in times.items()}
            if from_memory:
                cell.update({f"{s}_gb_per_s": round(w.data.nbytes / statistics.median(t) / 1e9, 1) for s, t in times.items()})
            cell["speedup"] = round(cell[f"{built}_gflops"] / cell[f"{other}_gflops"], 2)
            cell["identical"] = same
            out[name][n] = cell
            print(name, n, cell, flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 32, 64, 128, 512])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--prefill", type=int, nargs="*", default=[], help="prompt lengths to time a prefill of")
    p.add_argument("--model", default=None, help="for --prefill (default: the embedded model)")
    p.add_argument("--skip-matrices", action="store_true")
    p.add_argument("--interleave", action="store_true", help="legacy types' tokens interleaved (ltile) against one row by four (lrow)")
    p.add_argument("--kinterleave", action="store_true", help="K-quant tokens interleaved (ktile) against one row by four")
    p.add_argument("--prefetch", action="store_true", help="long rows prefetched a group at a time against all at once")
    p.add_argument("--against", type=Path, default=None, help="another source of kernels/cpu_kernels.cpp to compare with")
    p.add_argument("--from-memory", action="store_true", help="cycle copies of each matrix, so its bytes come from memory")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    cpu = get_platform(torch.device("cpu"))
    kernels = cpu.kernels()
    files = load_model_files(None)
    matrices = {"smollm2 gate (Q4_1 1536x576)": files.weights["model.layers.0.mlp.gate_proj.weight"],
                "smollm2 down (Q4_1 576x1536)": files.weights["model.layers.0.mlp.down_proj.weight"],
                "1B up (Q4_K 8192x2048)": made_matrix("Q4_K", 8192, 2048),
                "1B down (Q6_K 2048x8192)": made_matrix("Q6_K", 2048, 8192),
                "1B qkv (Q8_0 3072x2048)": made_matrix("Q8_0", 3072, 2048),
                # a gpt-oss-20b expert's gate and up, in its own MXFP4 and in Q4_0 of about its size
                "gpt-oss expert (MXFP4 5760x2880)": made_matrix("MXFP4", 5760, 2880),
                "gpt-oss expert (Q4_0 5760x2880)": made_matrix("Q4_0", 5760, 2880)}
    report = {"command": "bench/gemm.py " + " ".join(sys.argv[1:]), "machine": machine(),
              "bf16_gemm_available": cpu.fast_bf16 and cpu.onednn_bf16, "int8_gemm_available": kernels.int8_gemm,
              "prefill_gemms": cpu.prefill_gemms, "matrices": {}}
    if args.interleave:
        matrices["1B qkv (Q4_1 3072x2048)"] = made_matrix("Q4_1", 3072, 2048)
    if args.kinterleave:
        matrices["8B up (Q4_K 14336x4096)"] = made_matrix("Q4_K", 14336, 4096)
    if args.kinterleave:
        matrices["1B down (Q5_K 2048x8192)"] = made_matrix("Q5_K", 2048, 8192)
    if args.against or args.prefetch:
        # random blocks: the tests' quantiser takes minutes at these sizes, and speed does not care
        from tests.kquants import random_blocks

        for name, kind, rows, cols in (("8B down (Q4_K 4096x14336)", "Q4_K", 4096, 14336),
                                       ("1B LM head (Q6_K 49152x2048)", "Q6_K", 49152, 2048)):
            matrices[name] = BlockTensor(kind, random_blocks(kind, rows, cols, np.random.default_rng(0)), cols)
    for variant in [v for v in VARIANTS if getattr(args, v)]:
        report[variant] = variant_compare(kernels, matrices, args.rows, args.repeats, variant, args.against,
                                          args.from_memory)
        args.skip_matrices = True
    for name, w in ({} if args.skip_matrices else matrices).items():
        lin = BlockLinear([w], None, kernels, [("bf16", 1)])
        rows = {}
        for n in args.rows:
            x = torch.randn(n, w.cols)
            blocks = median_s(lambda: kernels.block_linear(x, lin.matrix), args.repeats, warmup=1)
            panels = median_s(lambda: lin._bf16_panels(x), args.repeats, warmup=1)
            flop = 2 * w.rows * w.cols * n
            rows[n] = {"block_kernels_gflops": round(flop / blocks / 1e9, 1), "bf16_panels_gflops": round(flop / panels / 1e9, 1),
                       "panels_speedup": round(blocks / panels, 2)}
            if kernels.int8_gemm and w.cols % 256 == 0:
                int8 = median_s(lambda: kernels.block_gemm(x, lin.matrix), args.repeats, warmup=1)
                rows[n].update({"int8_gemm_gflops": round(flop / int8 / 1e9, 1), "int8_over_blocks": round(blocks / int8, 2),
                                "int8_over_panels": round(panels / int8, 2)})
            print(name, n, rows[n], flush=True)
        report["matrices"][name] = rows
    if args.prefill:
        report["prefill"] = prefill_times(args.model, args.prefill, args.repeats)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
