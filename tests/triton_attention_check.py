"""Run by tests/test_triton_attention.py in a subprocess with TRITON_INTERPRET=1 (triton reads it
when a kernel is decorated, i.e. at import): each attention Triton kernel on CPU tensors against
its plain-torch reference from kernels/paged_attention.py. Prints each failure; exit 1 if any.

Shapes: ragged lengths including 1 and page boundaries, GQA ratios 1/3/8, page sizes 1 and 16,
float32 and bfloat16; sliding windows and attention sinks, alone and together. Outputs start as NaN, so an element the kernel fails to write fails the check.
Tolerances: float32 1e-4 (abs and rel); bfloat16 2e-2 (the kernels round softmax weights to bf16
before the PV product, and the output itself is bf16), both against a float32 reference computed
on the same (bf16-rounded) inputs.
"""
from __future__ import annotations

import os
import sys


import torch  # noqa: E402

from radixserve.kernels.paged_attention import attention_bias, decode_attention, decode_kv_rows, extend_attention, write_kv  # noqa: E402
from radixserve.kernels.triton_attention import (decode_attention_triton, extend_attention_triton,  # noqa: E402
                                      write_kv_triton)

TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}
KV_HEADS = 2
GQA_DIMS = {1: 16, 3: 24, 8: 32}  # query heads per kv head -> head dim (24: not a power of two)


class PagedContext:
    """A random KV cache and a page table whose rows hold shuffled pages."""

    def __init__(self, lens: list[int], page_size: int, dim: int, dtype: torch.dtype, gen: torch.Generator):
        self.p = page_size
        pages_per_row = [-(-n // page_size) for n in lens]
        num_pages = sum(pages_per_row) + 3  # a few pages no request owns
        shape = (num_pages + 1, page_size, KV_HEADS, dim)
        self.k = torch.randn(shape, generator=gen).to(dtype)
        self.v = torch.randn(shape, generator=gen).to(dtype)
        self.pad_page = num_pages
        self.k[self.pad_page] = 0
        self.v[self.pad_page] = 0
        perm = torch.randperm(num_pages, generator=gen)
        width = max(pages_per_row) + 2
        # entries past a request's pages hold other pages (stale), as in the engine
        self.table = torch.randint(0, num_pages, (len(lens) + 2, width), generator=gen)
        self.rows = torch.randperm(len(lens) + 2, generator=gen)[:len(lens)]
        used = 0
        for r, n in zip(self.rows.tolist(), pages_per_row):
            self.table[r, :n] = perm[used:used + n]
            used += n

    def slots(self, row: int, length: int) -> torch.Tensor:
        pos = torch.arange(length)
        return self.table[row, pos // self.p] * self.p + pos % self.p


def close(name: str, got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> bool:
    tol = TOL[dtype]
    ok = torch.isfinite(got).all() and torch.allclose(got.float(), want.float(), atol=tol, rtol=tol)
    if not ok:
        err = (got.float() - want.float()).abs().nan_to_num(float("inf")).max().item()
        print(f"FAIL {name}: max abs error {err:.3g} (tolerance {tol}); NaNs: {int(got.isnan().sum())}")
    return bool(ok)


def check_write_kv(gen: torch.Generator) -> int:
    failures = 0
    for dtype in TOL:
        for page_size in (1, 16):
            ctx = PagedContext([5, 17], page_size, 24, dtype, gen)
            ctx.k.fill_(float("nan"))
            ctx.v.fill_(float("nan"))
            slots = torch.cat([ctx.slots(ctx.rows[0].item(), 5), ctx.slots(ctx.rows[1].item(), 17)])
            qkv = torch.randn(22, (4 + 2 * KV_HEADS) * 24, generator=gen).to(dtype)
            # k is a strided view of a fused projection, as in the model
            k = qkv[:, 4 * 24:(4 + KV_HEADS) * 24].view(22, KV_HEADS, 24)
            v = qkv[:, (4 + KV_HEADS) * 24:].reshape(22, KV_HEADS, 24)
            want_k, want_v = ctx.k.clone(), ctx.v.clone()
            write_kv(want_k, want_v, slots, k, v)
            write_kv_triton(ctx.k, ctx.v, slots, k, v)
            for name, got, want in (("k", ctx.k, want_k), ("v", ctx.v, want_v)):
                same = torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num())
                if not same:
                    failures += 1
                    print(f"FAIL write_kv {name} dtype={dtype} page_size={page_size}")
    return failures


def decode_reference(q, ctx: PagedContext, lens: list[int], scale: float, window=None, sinks=None) -> torch.Tensor:
    """The torch path's inputs, built the way ModelRunner.build builds them."""
    lens_t = torch.tensor(lens)
    n_pages = -(-max(lens) // ctx.p)
    pages = ctx.table[ctx.rows, :n_pages]
    page_used = torch.arange(n_pages) * ctx.p < lens_t.unsqueeze(1)
    pages = pages.masked_fill(~page_used, ctx.pad_page)
    positions = torch.arange(n_pages * ctx.p)
    attend = positions < lens_t.unsqueeze(1)
    if window is not None:
        attend &= positions >= lens_t.unsqueeze(1) - window
    kv_rows = decode_kv_rows(pages, ctx.p, ctx.k.shape[2])
    return decode_attention(q.float(), ctx.k.float(), ctx.v.float(), kv_rows, attention_bias(attend[:, None, None, :]),
                            scale, sinks=sinks)


def check_decode(gen: torch.Generator) -> int:
    failures = 0
    for group, dim in GQA_DIMS.items():
        for page_size in (1, 16):
            # 1, page boundaries, and lengths that end mid-page and mid-split
            lens = [1, 16, 17, 33, int(torch.randint(2, 48, (1,), generator=gen)), 32]
            for dtype in TOL:
                ctx = PagedContext(lens, page_size, dim, dtype, gen)
                q = torch.randn(len(lens), KV_HEADS * group, dim, generator=gen).to(dtype)
                scale = dim ** -0.5
                want = decode_reference(q, ctx, lens, scale)
                for splits in (1, 3):
                    out = torch.full_like(q, float("nan"))
                    decode_attention_triton(q, ctx.k, ctx.v, ctx.table, ctx.rows, torch.tensor(lens), scale,
                                            num_splits=splits, out=out, block_n=16)
                    name = f"decode group={group} page_size={page_size} dtype={dtype} splits={splits}"
                    failures += not close(name, out, want, dtype)
    return failures


def window_and_sinks(heads: int, gen: torch.Generator):
    """Sliding windows (shorter than most contexts, not a page multiple) and attention sinks, alone
    and together (Gemma 3's local layers, gpt-oss's)."""
    sinks = torch.randn(heads, generator=gen) * 2
    return [(5, None), (None, sinks), (7, sinks)]


def check_decode_window_sinks(gen: torch.Generator) -> int:
    failures, group, dim = 0, 3, 24
    lens = [1, 16, 17, 33, 6, 40]
    for page_size in (1, 16):
        for dtype in TOL:
            ctx = PagedContext(lens, page_size, dim, dtype, gen)
            q = torch.randn(len(lens), KV_HEADS * group, dim, generator=gen).to(dtype)
            for window, sinks in window_and_sinks(KV_HEADS * group, gen):
                want = decode_reference(q, ctx, lens, dim ** -0.5, window, sinks)
                for splits in (1, 3):
                    out = torch.full_like(q, float("nan"))
                    decode_attention_triton(q, ctx.k, ctx.v, ctx.table, ctx.rows, torch.tensor(lens), dim ** -0.5,
                                            num_splits=splits, out=out, block_n=16, window=window, sinks=sinks)
                    name = (f"decode window={window} sinks={sinks is not None} page_size={page_size} dtype={dtype} "
                            f"splits={splits}")
                    failures += not close(name, out, want, dtype)
    return failures


def check_extend(gen: torch.Generator) -> int:
    """Segments after two decode rows (left untouched): plain prefill, prefill after a prefix hit,
    a chunk of a chunked prefill, a one-token chunk, and a prefix ending on a page boundary; with
    sliding windows and attention sinks too."""
    failures = 0
    for group, dim in GQA_DIMS.items():
        for page_size in (1, 16):
            for dtype in TOL:
                failures += extend_case(gen, group, dim, page_size, dtype)
    for page_size in (1, 16):
        for dtype in TOL:
            for window, sinks in window_and_sinks(KV_HEADS * 3, gen):
                failures += extend_case(gen, 3, 24, page_size, dtype, window, sinks)
    return failures


def extend_case(gen: torch.Generator, group: int, dim: int, page_size: int, dtype: torch.dtype,
                window=None, sinks=None) -> int:
    """Failures of one extend launch over every segment, against the torch reference."""
    failures = 0
    segments = [(0, 19), (16, 5), (7, 20), (30, 1), (32, 16)]  # (prefix, new tokens)
    lead = 2
    lens = [pre + n for pre, n in segments]
    ctx = PagedContext(lens, page_size, dim, dtype, gen)
    total = lead + sum(n for _, n in segments)
    q = torch.randn(total, KV_HEADS * group, dim, generator=gen).to(dtype)
    scale = dim ** -0.5
    want = torch.full((total, KV_HEADS * group, dim), float("nan"))
    meta, start = [], lead
    for (pre, n), row in zip(segments, ctx.rows.tolist()):
        slots = ctx.slots(row, pre + n)
        rows = slice(start, start + n)
        k_new = ctx.k.view(-1, KV_HEADS, dim)[slots[pre:]].float()
        v_new = ctx.v.view(-1, KV_HEADS, dim)[slots[pre:]].float()
        want[rows] = extend_attention(q[rows].float(), k_new, v_new, ctx.k.float(), ctx.v.float(),
                                      slots if pre else None, pre, scale, window, sinks)
        meta.append((start, n, pre, row))
        start += n
    meta_t = torch.tensor(meta, dtype=torch.int64).t().contiguous()
    out = torch.full_like(q, float("nan"))
    extend_attention_triton(q, ctx.k, ctx.v, ctx.table, meta_t, max(n for _, n in segments), scale,
                            out, block_m=16, block_n=16, window=window, sinks=sinks)
    name = (f"extend group={group} page_size={page_size} dtype={dtype} window={window} "
            f"sinks={sinks is not None}")
    failures += not close(name, out[lead:], want[lead:], dtype)
    if not out[:lead].isnan().all():
        failures += 1
        print(f"FAIL {name}: wrote rows outside its segments")
    return failures


def main() -> int:
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    gen = torch.Generator().manual_seed(0)
    failures = check_write_kv(gen) + check_decode(gen) + check_decode_window_sinks(gen) + check_extend(gen)
    print(f"{failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
