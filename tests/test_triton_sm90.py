"""Every Triton kernel variant the engine launches compiles for an H100 (sm_90) without register
spills, with no GPU here: Triton compiles for a CUDA target ahead of time, and ptxas (shipped in
triton's wheel) reports each kernel's registers, stack frame and spill bytes. A spill puts a
thread's values in local memory (off-chip), which on the decode path costs bandwidth the roofline
counts on; the launchers' tiles (kernels/triton_attention.py) are chosen so that there are none."""
from __future__ import annotations

import inspect
import os
import re
import subprocess
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")  # the CPU-only install has no triton; ours always does

from radixserve.kernels import bitmask, triton_attention, triton_moe  # noqa: E402

VARIANTS = triton_attention.compile_variants() + bitmask.compile_variants() + triton_moe.compile_variants()
PTXAS_REPORT = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def ptxas_command(arch: int) -> list[str]:
    """ptxas as this triton runs it: its own binary, and its flags (from 3.7 on it adds
    --regAllocOptLevel=2, which changes register allocation)."""
    from triton.backends.nvidia import compiler
    try:
        path = compiler.get_ptxas(arch).path
    except TypeError:   # an older triton: one ptxas for every arch
        path = compiler.get_ptxas().path
    own = inspect.getsource(compiler.CUDABackend.make_cubin)
    return [path, "-lineinfo", "-v"] + (["--regAllocOptLevel=2"] if "--regAllocOptLevel=2" in own else [])


def compile_sm90(variant, tmp: Path) -> dict:
    """The variant's PTX for sm_90a, assembled by ptxas as Triton itself would: its usage report."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = variant.signature | {name: "constexpr" for name in variant.constexprs}
    src = ASTSource(fn=variant.fn, signature=signature, constexprs=variant.constexprs)
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=variant.num_warps, num_stages=variant.num_stages))
    ptx = tmp / "kernel.ptx"
    ptx.write_text(compiled.asm["ptx"])
    done = subprocess.run(ptxas_command(90) + ["--gpu-name=sm_90a", str(ptx), "-o", str(tmp / "kernel.o")],
                          capture_output=True, text=True, check=True)
    report = done.stdout + done.stderr
    stack, stores, loads = map(int, PTXAS_REPORT.search(report).groups())
    registers = int(re.search(r"Used (\d+) registers", report).group(1))
    return dict(registers=registers, stack=stack, spill_stores=stores, spill_loads=loads)


@pytest.fixture(autouse=True)
def _quiet_fp_fusion(monkeypatch):
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")


@pytest.mark.parametrize("variant", VARIANTS, ids=[v.name for v in VARIANTS])
def test_kernel_compiles_for_sm90_without_register_spills(variant, tmp_path):
    usage = compile_sm90(variant, tmp_path)
    assert usage["spill_stores"] == usage["spill_loads"] == usage["stack"] == 0, usage
    assert usage["registers"] <= 255


def test_every_dtype_and_head_dim_has_its_own_tiles():
    names = {v.name for v in VARIANTS}
    for t in ("fp32", "bf16", "fp16"):
        for d in triton_attention.HEAD_DIMS:
            assert {f"extend {t} d{d}", f"decode split {t} d{d}"} <= names


def test_head_dims_between_the_tabled_ones_take_the_next_larger_tiles():
    import torch

    assert triton_attention.extend_tiles(torch.bfloat16, 96) == triton_attention.extend_tiles(torch.bfloat16, 128)
    assert triton_attention.extend_tiles(torch.float32, 16) == triton_attention.extend_tiles(torch.float32, 64)
    assert triton_attention.decode_tiles(torch.float16, 512) == triton_attention.decode_tiles(torch.float16, 256)


def test_the_spill_report_is_read_from_a_kernel_that_spills(tmp_path):
    """The check can fail: the extend kernel's old launch (64 x 64 tiles at Triton's default 4 warps
    and 3 stages) spills at bf16, head dim 128, the shape of most 7-8B models (fp32 spilled kilobytes)."""
    import dataclasses

    bf16 = next(v for v in VARIANTS if v.name == "extend bf16 d128")
    old = dataclasses.replace(bf16, constexprs=bf16.constexprs | dict(BLOCK_M=64, BLOCK_N=64), num_warps=4,
                              num_stages=3)
    assert compile_sm90(old, tmp_path)["spill_stores"] > 0


if os.environ.get("TRITON_INTERPRET") == "1":  # the interpreter compiles nothing
    pytestmark = pytest.mark.skip(reason="TRITON_INTERPRET=1 is set for this process")
