"""Run by tests/test_triton_moe.py in a subprocess with TRITON_INTERPRET=1: the grouped-matmul MoE
(kernels/triton_moe.py) against SparseMoE's per-expert loop on CPU tensors, for Mixtral-style
(SiLU-gated, no biases) and gpt-oss-style (clamped SwiGLU, biases) experts, float32 and bfloat16,
batches where some experts get no token and one where every token picks the same experts; and
each token's output alone equals its output in the batch. Exit 1 on any failure."""
from __future__ import annotations

import os
import sys

import torch

from radixserve.kernels.triton_moe import GroupedExperts, sort_rows
from radixserve.runtime.models.layer_ops import TorchLayerOps
from radixserve.runtime.models.linear import Linear
from radixserve.runtime.models.moe import SparseMoE, clamped_swiglu

HIDDEN, INTER, EXPERTS, TOP_K = 48, 40, 6, 2
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def layer(dtype: torch.dtype, biases: bool, gen: torch.Generator) -> tuple[SparseMoE, GroupedExperts]:
    def linear(out: int, inp: int) -> Linear:
        bias = (torch.randn(out, generator=gen) * 0.1).to(dtype) if biases else None
        return Linear((torch.randn(out, inp, generator=gen) * 0.2).to(dtype), bias)
    experts = [(linear(2 * INTER, HIDDEN), linear(HIDDEN, INTER)) for _ in range(EXPERTS)]
    router = torch.randn(EXPERTS, HIDDEN, generator=gen)
    act = clamped_swiglu(7.0, 1.702) if biases else TorchLayerOps().silu_mul
    return SparseMoE(router, experts, TOP_K, normalize=not biases, act=act, softmax_after_topk=biases), \
        GroupedExperts.of(experts)


def check_sort_rows() -> int:
    ids = torch.tensor([[3, 0], [3, 5], [0, 3]])
    rows, block_expert, position = sort_rows(ids, EXPERTS)
    flat = ids.flatten()
    ok = all(rows[position.flatten()[i]] == i for i in range(6))                  # each pair at its row
    ok &= all(block_expert[position.flatten()[i] // 16] == flat[i] for i in range(6))  # in its expert's block
    ok &= int((rows < 6).sum()) == 6 and rows.shape[0] % 16 == 0
    if not ok:
        print(f"FAIL sort_rows: rows {rows.tolist()} blocks {block_expert.tolist()} position {position.tolist()}")
    return int(not ok)


def main() -> int:
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    gen = torch.Generator().manual_seed(0)
    failures = check_sort_rows()
    for dtype in TOL:
        for biases in (False, True):
            moe, grouped = layer(dtype, biases, gen)
            for name, h in (("random 9 tokens", torch.randn(9, HIDDEN, generator=gen)),
                            ("one token", torch.randn(1, HIDDEN, generator=gen)),
                            ("same experts", torch.randn(1, HIDDEN, generator=gen).repeat(8, 1))):
                h = h.to(dtype)
                weights, ids = moe.route(h)
                want = moe(h).float()
                got = grouped(h, weights, ids, moe.act)
                moe.grouped = grouped   # the layer as CudaPlatform builds it: the grouped path instead of the loop
                if not torch.equal(moe(h), got.to(dtype)):
                    failures += 1
                    print(f"FAIL {name} dtype={dtype} biases={biases}: the layer did not take the grouped path")
                moe.grouped = None
                err = (got.to(dtype).float() - want).abs().max().item()
                scale = want.abs().max().item() or 1.0
                if not torch.isfinite(got).all() or err > TOL[dtype] * max(1.0, scale):
                    failures += 1
                    print(f"FAIL {name} dtype={dtype} biases={biases}: max error {err:.3g} (scale {scale:.3g})")
                # On the GPU a row's dot products do not depend on the other rows of its block; the
                # interpreter's run on numpy's BLAS, whose kernels sum a block's rows in different
                # orders: alone and batched agree to float32 rounding here, bit for bit there
                few = min(len(h), 3)
                alone = torch.cat([grouped(h[i:i + 1], weights[i:i + 1], ids[i:i + 1], moe.act) for i in range(few)])
                drift = (alone - got[:few]).abs().max().item()
                if drift > 1e-6 * max(1.0, scale):
                    failures += 1
                    print(f"FAIL {name} dtype={dtype} biases={biases}: a token alone differs from it in the batch "
                          f"by {drift:.3g}")
    print(f"{failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
