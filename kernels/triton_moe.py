"""Mixture-of-experts on CUDA: every expert of a layer in two grouped-matmul launches, with no host
sync (the per-expert loop of runtime/models/moe.py reads the routed experts back to the host).

Each (token, slot) pair the router chose is one row. Rows are sorted by expert and each expert's
rows padded to a whole block of BLOCK_M, all on the device; the grid is sized by the bound
T * k + experts * (BLOCK_M - 1) rows, known on the host from T alone.
A program computes one block of rows of one expert against one block of output columns; padding
rows compute nothing and are never read. A row's result depends on its own token and expert only,
and the k outputs of a token are summed in expert order: the same alone or in any batch.

The reference is SparseMoE's loop (tests/triton_moe_check.py compares the two).
"""
from __future__ import annotations

import os
from typing import Callable, Optional

import torch

from radixserve.kernels.triton_attention import KernelVariant, TRITON_TYPES

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the loop serves every device
    triton = None

BLOCK_M, BLOCK_N, BLOCK_K = 16, 64, 64
# fp32 dots run as exact FMAs ("ieee"), with whole tiles in registers: a narrower tile
_FP32_BLOCK_N = 32
# as in triton_attention: the interpreter multiplies bf16 dot operands as raw bits
_UPCAST_DOT = os.environ.get("TRITON_INTERPRET") == "1"

if triton is not None:
    @triton.jit
    def _grouped_matmul_kernel(x_ptr, w_ptr, b_ptr, out_ptr, rows_ptr, block_expert_ptr, n_valid, n_out, n_in,
                               x_stride, w_stride_e, w_stride_n, out_stride, GATHER: tl.constexpr,
                               TOP_K: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
                               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
                               UPCAST: tl.constexpr):
        # program (block of sorted rows, block of output columns): out[r] = x[src(r)] @ w[e]^T + b[e]
        # for the block's expert e; src(r) is the row's token (GATHER) or the row itself
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        e = tl.load(block_expert_ptr + pid_m).to(tl.int64)
        r = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        pair = tl.load(rows_ptr + r)            # the (token, slot) pair a row holds; n_valid: padding
        ok = pair < n_valid
        if GATHER:
            src = tl.where(ok, pair // TOP_K, 0).to(tl.int64)
        else:
            src = tl.where(ok, r, 0).to(tl.int64)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        c_ok = cols < n_out
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, n_in, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < n_in
            x = tl.load(x_ptr + src[:, None] * x_stride + ks[None, :], mask=ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_ptr + e * w_stride_e + cols[None, :] * w_stride_n + ks[:, None],
                        mask=c_ok[None, :] & k_ok[:, None], other=0.0)
            if UPCAST:
                acc += tl.dot(x.to(tl.float32), w.to(tl.float32), input_precision="ieee")
            else:
                acc += tl.dot(x.to(w.dtype), w, input_precision=PRECISION)
        if HAS_BIAS:
            acc += tl.load(b_ptr + e * n_out + cols, mask=c_ok, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + r[:, None].to(tl.int64) * out_stride + cols[None, :],
                 acc.to(out_ptr.dtype.element_ty), mask=ok[:, None] & c_ok[None, :])


def _block_n(dtype: torch.dtype) -> int:
    return _FP32_BLOCK_N if dtype == torch.float32 else BLOCK_N


def _grouped_matmul(x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor], rows: torch.Tensor,
                    block_expert: torch.Tensor, n_valid: int, top_k: int, gather: bool) -> torch.Tensor:
    """[padded rows, w.shape[1]] in x's dtype; rows past n_valid (padding) are left unwritten."""
    n_out, n_in = w.shape[1], w.shape[2]
    out = torch.empty(rows.shape[0], n_out, dtype=x.dtype, device=x.device)
    block_n = _block_n(w.dtype)
    grid = (block_expert.shape[0], triton.cdiv(n_out, block_n))
    _grouped_matmul_kernel[grid](x, w, w if b is None else b, out, rows, block_expert, n_valid, n_out, n_in,
                                 x.stride(0), w.stride(0), w.stride(1), out.stride(0), GATHER=gather, TOP_K=top_k,
                                 HAS_BIAS=b is not None, BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_K=BLOCK_K,
                                 PRECISION="ieee" if w.dtype == torch.float32 else None, UPCAST=_UPCAST_DOT)
    return out


def sort_rows(ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The router's [T, k] expert ids as grouped-matmul rows: (rows: the (token, slot) pair each
    padded row holds, T * k where it is padding; block_expert: each block's expert; position: the
    padded row of each pair, [T, k]). Device ops only; sizes follow from T, k and the expert count."""
    t, k = ids.shape
    n = t * k
    flat = ids.flatten()
    # not bincount: on CUDA it reads the largest id back to size its output (a host sync)
    counts = torch.zeros(num_experts, dtype=torch.long, device=ids.device).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    start = torch.cumsum(padded, 0) - padded                      # each expert's first padded row
    first = torch.cumsum(counts, 0) - counts                      # ... and first row unpadded
    order = torch.sort(flat, stable=True).indices                 # pairs by expert, then token
    rank = torch.arange(n, device=ids.device) - first[flat[order]]
    capacity = -(-(n + num_experts * (BLOCK_M - 1)) // BLOCK_M) * BLOCK_M
    position = torch.empty(n, dtype=torch.long, device=ids.device)
    position[order] = start[flat[order]] + rank
    rows = torch.full((capacity,), n, dtype=torch.long, device=ids.device)
    rows[position] = torch.arange(n, device=ids.device)
    # a block's expert: the one whose padded range holds it (the first to end after its start; an
    # empty expert ends where it starts and holds none); blocks past every range get the last expert
    # and only padding rows
    block_start = torch.arange(0, capacity, BLOCK_M, device=ids.device)
    block_expert = torch.searchsorted(start + padded, block_start, right=True).clamp_(max=num_experts - 1)
    return rows, block_expert, position.view(t, k)


class GroupedExperts:
    """One layer's experts as stacked weights: gate_up [E, 2I, H] (and bias [E, 2I]), down [E, H, I]
    (and bias [E, H]), all in the model's dtype on the device."""
    max_tokens = float("inf")   # every step, prefill included

    def __init__(self, gate_up: torch.Tensor, down: torch.Tensor, gate_up_bias: Optional[torch.Tensor] = None,
                 down_bias: Optional[torch.Tensor] = None):
        if triton is None:
            raise RuntimeError("triton is not installed")
        self.gate_up, self.down = gate_up.contiguous(), down.contiguous()
        self.gate_up_bias, self.down_bias = gate_up_bias, down_bias

    @classmethod
    def of(cls, experts: list[tuple]) -> "GroupedExperts":
        """From each expert's (gate_up, down) dense linear layers, whose weights then become views
        of the stacks: one copy of the experts in memory."""
        stack = lambda ts: None if ts[0] is None else torch.stack(ts)  # noqa: E731
        grouped = cls(torch.stack([g.weight for g, _ in experts]), torch.stack([d.weight for _, d in experts]),
                      stack([g.bias for g, _ in experts]), stack([d.bias for _, d in experts]))
        for e, (g, d) in enumerate(experts):
            g.weight, d.weight = grouped.gate_up[e], grouped.down[e]
            if grouped.gate_up_bias is not None:
                g.bias, d.bias = grouped.gate_up_bias[e], grouped.down_bias[e]
        return grouped

    def __call__(self, h: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                 act: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """h [T, hidden]; weights / ids [T, k] from the router -> [T, hidden] float32, each token's
        expert outputs weighted and added in expert order."""
        t, k = ids.shape
        rows, block_expert, position = sort_rows(ids, self.gate_up.shape[0])
        x = h.to(self.gate_up.dtype).contiguous()
        gate_up = _grouped_matmul(x, self.gate_up, self.gate_up_bias, rows, block_expert, t * k, k, gather=True)
        hidden = act(gate_up).contiguous()      # padding rows hold garbage that no valid row reads
        y = _grouped_matmul(hidden, self.down, self.down_bias, rows, block_expert, t * k, k, gather=False)
        by_expert = ids.argsort(dim=1, stable=True)
        position, weights = position.gather(1, by_expert), weights.gather(1, by_expert)
        out = y.index_select(0, position[:, 0]).float() * weights[:, :1]
        for j in range(1, k):
            out += y.index_select(0, position[:, j]).float() * weights[:, j:j + 1]
        return out


def compile_variants() -> list[KernelVariant]:
    """The grouped matmul as the layer launches it (gathered and not, with and without bias), per dtype."""
    variants = []
    for dtype, t in TRITON_TYPES.items():
        signature = dict(x_ptr=f"*{t}", w_ptr=f"*{t}", b_ptr=f"*{t}", out_ptr=f"*{t}", rows_ptr="*i64",
                         block_expert_ptr="*i64", n_valid="i32", n_out="i32", n_in="i32", x_stride="i32",
                         w_stride_e="i32", w_stride_n="i32", out_stride="i32")
        for gather in (True, False):
            for bias in (False, True):
                variants.append(KernelVariant(
                    f"moe grouped matmul {t}" + (" gather" if gather else "") + (" bias" if bias else ""),
                    _grouped_matmul_kernel, signature,
                    dict(GATHER=gather, TOP_K=8, HAS_BIAS=bias, BLOCK_M=BLOCK_M, BLOCK_N=_block_n(dtype),
                         BLOCK_K=BLOCK_K, PRECISION="ieee" if dtype == torch.float32 else None, UPCAST=False)))
    return variants
