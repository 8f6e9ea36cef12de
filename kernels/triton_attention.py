"""Paged attention and the KV write as Triton kernels (the CUDA path).

Their references are the plain-torch functions in kernels/paged_attention.py (`write_kv`,
`decode_attention`, `extend_attention`); tests/triton_attention_check.py compares the two.

Layouts: K/V caches are [pages + 1, page_size, kv_heads, dim], contiguous; the page table is int64
[rows, max_pages]; position i of the request in page-table row r lives in slot
table[r, i // page_size] * page_size + i % page_size. Scores, softmax and sums run in float32
whatever the cache dtype. Context positions past a request's length are never read, so stale page
table entries and the padding page's contents do not matter here.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the torch backend serves every device
    triton = None


def _pow2(n: int, least: int = 1) -> int:
    return max(least, 1 << (n - 1).bit_length())


@dataclass(frozen=True)
class Tiles:
    """A kernel's launch shape."""
    block_m: int      # query rows per program (extend); query heads per program (decode: the group, padded)
    block_n: int      # context positions per loop iteration
    num_warps: int
    num_stages: int   # software pipelining of the loop's loads


# The largest tiles that compile for sm_90 without register spills, per (cache dtype, head dim
# padded to a power of two): tests/test_triton_sm90.py compiles every entry with ptxas and holds
# it to that. fp32 dots run as exact FMAs ("ieee"), not on tensor cores, and hold whole tiles in
# registers: hence their small tiles (the default 64 x 64 at 4 warps spilled 10.9 KB a thread).
HEAD_DIMS = (64, 128, 256)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_EXTEND_TILES = {
    (torch.float32, 64): Tiles(32, 32, 8, 2), (torch.float32, 128): Tiles(16, 32, 4, 2),
    (torch.float32, 256): Tiles(16, 32, 8, 2),
    (torch.bfloat16, 64): Tiles(128, 64, 8, 2), (torch.bfloat16, 128): Tiles(64, 32, 8, 2),
    (torch.bfloat16, 256): Tiles(16, 32, 8, 2),
    (torch.float16, 64): Tiles(128, 64, 8, 2), (torch.float16, 128): Tiles(64, 32, 8, 2),
    (torch.float16, 256): Tiles(16, 32, 8, 2),
}
_DECODE_TILES = {
    (torch.float32, 64): Tiles(16, 64, 4, 2), (torch.float32, 128): Tiles(16, 32, 4, 1),
    (torch.float32, 256): Tiles(16, 32, 8, 2),
    (torch.bfloat16, 64): Tiles(16, 64, 8, 2), (torch.bfloat16, 128): Tiles(16, 64, 8, 2),
    (torch.bfloat16, 256): Tiles(16, 32, 8, 2),
    (torch.float16, 64): Tiles(16, 64, 8, 2), (torch.float16, 128): Tiles(16, 64, 8, 2),
    (torch.float16, 256): Tiles(16, 32, 8, 2),
}


def _tiles(table: dict, dtype: torch.dtype, dim: int) -> Tiles:
    # smaller head dims take the 64 entry (fewer registers); larger ones the 256 entry (correct,
    # though it may spill)
    key = min(max(64, _pow2(dim)), 256)
    return table.get((dtype, key)) or table[(torch.float32, key)]


def extend_tiles(dtype: torch.dtype, dim: int) -> Tiles:
    return _tiles(_EXTEND_TILES, dtype, dim)


def decode_tiles(dtype: torch.dtype, dim: int) -> Tiles:
    return _tiles(_DECODE_TILES, dtype, dim)


def _dot_precision(dtype: torch.dtype) -> Optional[str]:
    # fp32 operands would otherwise be truncated to tf32 on tensor cores (~1e-3 relative error)
    return "ieee" if dtype == torch.float32 else None


# Triton 3.9's interpreter multiplies bf16 dot operands as raw bits (garbage results), so under it
# operands are widened to fp32 first; the bf16 rounding of softmax weights still happens before.
_UPCAST_DOT = os.environ.get("TRITON_INTERPRET") == "1"


if triton is not None:
    @triton.jit
    def _mma(a, b, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
        if UPCAST:
            return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
        return tl.dot(a, b, input_precision=PRECISION)

    @triton.jit
    def _write_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slots_ptr,
                         k_stride_t, k_stride_h, v_stride_t, v_stride_h,
                         KV_HEADS: tl.constexpr, DIM: tl.constexpr,
                         BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
        # one program per new token: all its kv heads go to one slot
        t = tl.program_id(0).to(tl.int64)
        slot = tl.load(slots_ptr + t).to(tl.int64)
        h = tl.arange(0, BLOCK_H)[:, None]
        d = tl.arange(0, BLOCK_D)[None, :]
        m = (h < KV_HEADS) & (d < DIM)
        dst = slot * (KV_HEADS * DIM) + h * DIM + d
        k = tl.load(k_ptr + t * k_stride_t + h * k_stride_h + d, mask=m)
        tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=m)
        v = tl.load(v_ptr + t * v_stride_t + h * v_stride_h + d, mask=m)
        tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=m)

    @triton.jit
    def _kv_block(table_ptr, row, table_stride, pos, p_ok, kvh, d, d_ok, PAGE_SIZE: tl.constexpr,
                  KV_HEADS: tl.constexpr, DIM: tl.constexpr):
        """Cache offsets [positions, dim] of KV head `kvh` at context positions `pos` of page-table
        row `row`, and where they are valid."""
        page = tl.load(table_ptr + row * table_stride + pos // PAGE_SIZE, mask=p_ok, other=0)
        slot = page * PAGE_SIZE + pos % PAGE_SIZE
        return slot[:, None] * (KV_HEADS * DIM) + kvh * DIM + d[None, :], p_ok[:, None] & d_ok[None, :]

    @triton.jit
    def _online_softmax(s, m_i, l_i, acc, v_cache_ptr, off, kv_ok, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
        """One block of scores `s` into the running max, sum and weighted values (flash attention).
        A row may see nothing in a block yet (a sliding window starts later for it): its running
        max stays -inf, and the exponents are taken from 0 instead, giving 0, never NaN."""
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_ref)
        p = tl.exp(s - m_ref[:, None])
        v = tl.load(v_cache_ptr + off, mask=kv_ok, other=0.0)
        return m_new, l_i * alpha + tl.sum(p, 1), acc * alpha[:, None] + _mma(p.to(v.dtype), v, PRECISION, UPCAST)

    @triton.jit
    def _decode_split_kernel(q_ptr, k_cache_ptr, v_cache_ptr, table_ptr, rows_ptr, lens_ptr,
                             part_out_ptr, part_lse_ptr, scale, window, q_stride_b, q_stride_h, table_stride,
                             PAGE_SIZE: tl.constexpr, KV_HEADS: tl.constexpr, GROUP: tl.constexpr,
                             DIM: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
                             BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
        # program (request, kv head, split): every query head of the kv head's group against the
        # split's share of the context (its last `window` positions where window > 0); writes the
        # split's normalised output and its logsumexp
        b = tl.program_id(0).to(tl.int64)
        kvh = tl.program_id(1)
        split = tl.program_id(2)
        num_splits = tl.num_programs(2)
        length = tl.load(lens_ptr + b)
        row = tl.load(rows_ptr + b).to(tl.int64)
        # whole blocks per split, so that the split count can stay fixed (CUDA graphs) while the
        # lengths vary: short requests simply leave their last splits empty
        first = tl.where(window > 0, tl.maximum(length - window, 0), 0)
        per_split = tl.cdiv(tl.cdiv(length - first, num_splits), BLOCK_N) * BLOCK_N
        lo = first + split * per_split
        hi = tl.minimum(lo + per_split, length)

        g = tl.arange(0, BLOCK_G)
        d = tl.arange(0, BLOCK_D)
        heads = kvh * GROUP + g
        g_ok = g < GROUP
        d_ok = d < DIM
        q = tl.load(q_ptr + b * q_stride_b + heads[:, None] * q_stride_h + d[None, :],
                    mask=g_ok[:, None] & d_ok[None, :], other=0.0)
        m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
        for start in range(lo, hi, BLOCK_N):
            pos = start + tl.arange(0, BLOCK_N)
            p_ok = pos < hi
            off, kv_ok = _kv_block(table_ptr, row, table_stride, pos, p_ok, kvh, d, d_ok, PAGE_SIZE, KV_HEADS, DIM)
            k = tl.load(k_cache_ptr + off, mask=kv_ok, other=0.0)
            s = _mma(q, tl.trans(k), PRECISION, UPCAST) * scale
            s = tl.where(p_ok[None, :], s, float("-inf"))  # finite somewhere: every block has a valid position
            m_i, l_i, acc = _online_softmax(s, m_i, l_i, acc, v_cache_ptr, off, kv_ok, PRECISION, UPCAST)
        # an empty split: lse -inf and output 0, so the reduction gives it no weight
        lse = tl.where(l_i > 0, m_i + tl.log(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        base = (b * (KV_HEADS * GROUP) + heads) * num_splits + split
        tl.store(part_out_ptr + base[:, None] * DIM + d[None, :], out, mask=g_ok[:, None] & d_ok[None, :])
        tl.store(part_lse_ptr + base, lse, mask=g_ok)

    @triton.jit
    def _decode_reduce_kernel(part_out_ptr, part_lse_ptr, out_ptr, sinks_ptr, out_stride_b, out_stride_h,
                              num_splits, DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
                              HAS_SINKS: tl.constexpr):
        # program (request, head): weight each split's output by exp(its lse - the total lse); a
        # head's sink logit (gpt-oss) joins the total as one more term that carries no value
        b = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1)
        s = tl.arange(0, BLOCK_S)
        d = tl.arange(0, BLOCK_D)
        s_ok = s < num_splits
        d_ok = d < DIM
        base = (b * tl.num_programs(1) + h) * num_splits
        lse = tl.load(part_lse_ptr + base + s, mask=s_ok, other=float("-inf"))
        m = tl.max(lse, 0)  # split 0 is never empty (length >= 1)
        if HAS_SINKS:
            sink = tl.load(sinks_ptr + h).to(tl.float32)
            m = tl.maximum(m, sink)
            w = tl.exp(lse - m)
            w = w / (tl.sum(w, 0) + tl.exp(sink - m))
        else:
            w = tl.exp(lse - m)
            w = w / tl.sum(w, 0)
        o = tl.load(part_out_ptr + (base + s)[:, None] * DIM + d[None, :], mask=s_ok[:, None] & d_ok[None, :],
                    other=0.0)
        out = tl.sum(o * w[:, None], 0)
        tl.store(out_ptr + b * out_stride_b + h * out_stride_h + d, out.to(out_ptr.dtype.element_ty), mask=d_ok)

    @triton.jit
    def _extend_kernel(q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, table_ptr, meta_ptr, sinks_ptr, num_segments,
                       scale, window, q_stride_t, q_stride_h, out_stride_t, out_stride_h, table_stride,
                       PAGE_SIZE: tl.constexpr, KV_HEADS: tl.constexpr, GROUP: tl.constexpr,
                       DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_D: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
                       HAS_SINKS: tl.constexpr):
        # program (segment, block of its new tokens, query head): attends over the segment's
        # context positions 0 .. prefix + last token of the block, all read through the page
        # table (the new tokens' K/V were written first); causal mask on the new tokens
        seg = tl.program_id(0)
        qb = tl.program_id(1)
        h = tl.program_id(2)
        start = tl.load(meta_ptr + seg)                       # meta rows: start, length, prefix, row
        n = tl.load(meta_ptr + num_segments + seg)
        prefix = tl.load(meta_ptr + 2 * num_segments + seg)
        row = tl.load(meta_ptr + 3 * num_segments + seg).to(tl.int64)
        kvh = h // GROUP

        i = qb * BLOCK_M + tl.arange(0, BLOCK_M)  # token index within the segment
        i_ok = i < n
        d = tl.arange(0, BLOCK_D)
        d_ok = d < DIM
        rows = (start + i).to(tl.int64)
        q = tl.load(q_ptr + rows[:, None] * q_stride_t + h * q_stride_h + d[None, :],
                    mask=i_ok[:, None] & d_ok[None, :], other=0.0)
        q_pos = prefix + i
        # blocks past the segment's end read nothing
        hi = tl.where(qb * BLOCK_M < n, prefix + tl.minimum((qb + 1) * BLOCK_M, n), 0)
        # a sliding window (window > 0): each row sees the last `window` positions up to itself,
        # and the blocks before the block's first row's window are not read at all
        lo = tl.where(window > 0, tl.maximum(prefix + qb * BLOCK_M - window + 1, 0) // BLOCK_N * BLOCK_N, 0)
        q_first = tl.where(window > 0, q_pos - window + 1, 0)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        for k_start in range(lo, hi, BLOCK_N):
            pos = k_start + tl.arange(0, BLOCK_N)
            p_ok = pos < hi
            off, kv_ok = _kv_block(table_ptr, row, table_stride, pos, p_ok, kvh, d, d_ok, PAGE_SIZE, KV_HEADS, DIM)
            k = tl.load(k_cache_ptr + off, mask=kv_ok, other=0.0)
            s = _mma(q, tl.trans(k), PRECISION, UPCAST) * scale
            seen = (pos[None, :] <= q_pos[:, None]) & (pos[None, :] >= q_first[:, None])
            s = tl.where(p_ok[None, :] & seen, s, float("-inf"))
            m_i, l_i, acc = _online_softmax(s, m_i, l_i, acc, v_cache_ptr, off, kv_ok, PRECISION, UPCAST)
        if HAS_SINKS:  # the head's sink logit joins the softmax's sum, with no value
            l_i += tl.exp(tl.load(sinks_ptr + h).to(tl.float32) - m_i)
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(out_ptr + rows[:, None] * out_stride_t + h * out_stride_h + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=i_ok[:, None] & d_ok[None, :])


def _require_triton() -> None:
    if triton is None:
        raise RuntimeError("triton is not installed")


def write_kv_triton(k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                    k: torch.Tensor, v: torch.Tensor) -> None:
    """k, v: [T, kv_heads, dim] (unit stride in dim) go to `slots` ([T] int64)."""
    _require_triton()
    t, kv_heads, dim = k.shape
    if t == 0:
        return
    assert k.stride(2) == 1 and v.stride(2) == 1 and k_cache.is_contiguous() and v_cache.is_contiguous()
    _write_kv_kernel[(t,)](k, v, k_cache, v_cache, slots, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                           KV_HEADS=kv_heads, DIM=dim, BLOCK_H=_pow2(kv_heads), BLOCK_D=_pow2(dim))


def num_decode_splits(batch: int, kv_heads: int, max_len: int, num_sms: int = 132,
                      min_tokens_per_split: int = 256, max_splits: int = 32) -> int:
    """Splits per request: enough programs to fill the device twice over, but no split shorter
    than `min_tokens_per_split` (below that the second pass costs more than it saves)."""
    want = -(-2 * num_sms // max(1, batch * kv_heads))
    return max(1, min(want, max_splits, -(-max_len // min_tokens_per_split)))


def decode_attention_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            page_table: torch.Tensor, rows: torch.Tensor, lens: torch.Tensor, scale: float,
                            num_splits: int, out: Optional[torch.Tensor] = None,
                            block_n: Optional[int] = None, window: Optional[int] = None,
                            sinks: Optional[torch.Tensor] = None) -> torch.Tensor:
    """One query token per request (flash-decoding: `num_splits` partial passes, then a reduction).

    q: [B, heads, dim]; rows: [B] page-table row of each request; lens: [B] context length,
    the new token included (>= 1; its K/V already written); `window`: attend only to the last
    `window` positions; `sinks` (float32 [heads]) join each head's softmax. Returns out ([B, heads, dim]).
    No host sync, and the launch shape depends only on B and num_splits: safe in CUDA graphs.
    """
    _require_triton()
    b, heads, dim = q.shape
    kv_heads, page_size = k_cache.shape[2], k_cache.shape[1]
    if out is None:
        out = torch.empty_like(q)
    if b == 0:
        return out
    assert q.stride(2) == 1 and out.stride(2) == 1 and k_cache.is_contiguous() and page_table.stride(1) == 1
    group = heads // kv_heads
    part_out = torch.empty(b, heads, num_splits, dim, dtype=torch.float32, device=q.device)
    part_lse = torch.empty(b, heads, num_splits, dtype=torch.float32, device=q.device)
    block_d = _pow2(dim, 16)
    tiles = decode_tiles(k_cache.dtype, dim)
    _decode_split_kernel[(b, kv_heads, num_splits)](
        q, k_cache, v_cache, page_table, rows, lens, part_out, part_lse, scale, window or 0,
        q.stride(0), q.stride(1), page_table.stride(0),
        PAGE_SIZE=page_size, KV_HEADS=kv_heads, GROUP=group, DIM=dim,
        BLOCK_G=_pow2(group, 16), BLOCK_D=block_d, BLOCK_N=block_n or tiles.block_n,
        PRECISION=_dot_precision(q.dtype), UPCAST=_UPCAST_DOT, num_warps=tiles.num_warps,
        num_stages=tiles.num_stages)
    _decode_reduce_kernel[(b, heads)](part_out, part_lse, out, part_lse if sinks is None else sinks, out.stride(0),
                                      out.stride(1), num_splits, DIM=dim, BLOCK_S=_pow2(num_splits),
                                      BLOCK_D=block_d, HAS_SINKS=sinks is not None)
    return out


def extend_attention_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            page_table: torch.Tensor, meta: torch.Tensor, max_len: int, scale: float,
                            out: torch.Tensor, block_m: Optional[int] = None,
                            block_n: Optional[int] = None, window: Optional[int] = None,
                            sinks: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Every extend segment of a batch in one launch.

    q: [T, heads, dim] (the whole flat batch); meta: int64 [4, S] rows start (first row of the
    segment in q), length (new tokens), prefix (tokens cached before them), page-table row;
    max_len: the longest segment (sizes the grid). Each new token attends to the whole prefix
    and causally to the segment's new tokens, whose K/V must already be in the cache; with `window`,
    only to the last `window` positions up to itself; `sinks` (float32 [heads]) join each head's
    softmax. Writes the segments' rows of `out` ([T, heads, dim]) and returns it.
    """
    _require_triton()
    heads, dim = q.shape[1], q.shape[2]
    kv_heads, page_size = k_cache.shape[2], k_cache.shape[1]
    num_segments = meta.shape[1]
    if num_segments == 0 or max_len == 0:
        return out
    assert q.stride(2) == 1 and out.stride(2) == 1 and meta.is_contiguous() and page_table.stride(1) == 1
    tiles = extend_tiles(k_cache.dtype, dim)
    block_m, block_n = block_m or tiles.block_m, block_n or tiles.block_n
    grid = (num_segments, triton.cdiv(max_len, block_m), heads)
    # without sinks the kernel never reads sinks_ptr; any tensor will do
    _extend_kernel[grid](q, k_cache, v_cache, out, page_table, meta, meta if sinks is None else sinks, num_segments,
                         scale, window or 0, q.stride(0), q.stride(1), out.stride(0), out.stride(1),
                         page_table.stride(0), PAGE_SIZE=page_size, KV_HEADS=kv_heads, GROUP=heads // kv_heads,
                         DIM=dim, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=_pow2(dim, 16),
                         PRECISION=_dot_precision(q.dtype), UPCAST=_UPCAST_DOT, HAS_SINKS=sinks is not None,
                         num_warps=tiles.num_warps, num_stages=tiles.num_stages)
    return out


# ---- ahead-of-time compilation -------------------------------------------------------------
@dataclass(frozen=True)
class KernelVariant:
    """One specialisation of a kernel as a launcher here builds it: what compiling it ahead of time
    for a GPU that is not here needs (tests/test_triton_sm90.py)."""
    name: str
    fn: object
    signature: dict[str, str]     # argument -> Triton type ("*bf16", "i32", "fp32")
    constexprs: dict[str, object]
    num_warps: int = 4            # Triton's defaults on CUDA
    num_stages: int = 3


TRITON_TYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def compile_variants(page_size: int = 16, kv_heads: int = 8, group: int = 4) -> list[KernelVariant]:
    """Every cache dtype and head dim of HEAD_DIMS, for each kernel, with the launchers' tiles."""
    variants = []
    ints = lambda *names: {n: "i32" for n in names}  # noqa: E731
    for dtype in DTYPES:
        t = TRITON_TYPES[dtype]
        for dim in HEAD_DIMS:
            common = dict(PAGE_SIZE=page_size, KV_HEADS=kv_heads, GROUP=group, DIM=dim, BLOCK_D=_pow2(dim, 16),
                          PRECISION=_dot_precision(dtype), UPCAST=False)
            e = extend_tiles(dtype, dim)
            variants.extend(KernelVariant(
                f"extend {t} d{dim}" + (" sinks" if sinks else ""), _extend_kernel,
                dict(q_ptr=f"*{t}", k_cache_ptr=f"*{t}", v_cache_ptr=f"*{t}", out_ptr=f"*{t}", table_ptr="*i64",
                     meta_ptr="*i64", sinks_ptr="*fp32", num_segments="i32", scale="fp32", window="i32")
                | ints("q_stride_t", "q_stride_h", "out_stride_t", "out_stride_h", "table_stride"),
                common | dict(BLOCK_M=e.block_m, BLOCK_N=e.block_n, HAS_SINKS=sinks), e.num_warps, e.num_stages)
                for sinks in (False, True))
            d = decode_tiles(dtype, dim)
            variants.append(KernelVariant(
                f"decode split {t} d{dim}", _decode_split_kernel,
                dict(q_ptr=f"*{t}", k_cache_ptr=f"*{t}", v_cache_ptr=f"*{t}", table_ptr="*i64", rows_ptr="*i64",
                     lens_ptr="*i64", part_out_ptr="*fp32", part_lse_ptr="*fp32", scale="fp32", window="i32")
                | ints("q_stride_b", "q_stride_h", "table_stride"),
                common | dict(BLOCK_G=_pow2(group, 16), BLOCK_N=d.block_n), d.num_warps, d.num_stages))
            variants.extend(KernelVariant(   # BLOCK_S 32: num_decode_splits' most
                f"decode reduce {t} d{dim}" + (" sinks" if sinks else ""), _decode_reduce_kernel,
                dict(part_out_ptr="*fp32", part_lse_ptr="*fp32", out_ptr=f"*{t}", sinks_ptr="*fp32")
                | ints("out_stride_b", "out_stride_h", "num_splits"),
                dict(DIM=dim, BLOCK_S=32, BLOCK_D=_pow2(dim, 16), HAS_SINKS=sinks)) for sinks in (False, True))
            variants.append(KernelVariant(
                f"write kv {t} d{dim}", _write_kv_kernel,
                dict(k_ptr=f"*{t}", v_ptr=f"*{t}", k_cache_ptr=f"*{t}", v_cache_ptr=f"*{t}", slots_ptr="*i64")
                | ints("k_stride_t", "k_stride_h", "v_stride_t", "v_stride_h"),
                dict(KV_HEADS=kv_heads, DIM=dim, BLOCK_H=_pow2(kv_heads), BLOCK_D=_pow2(dim))))
    return variants
