"""The CPU kernels (kernels/cpu_kernels.cpp) against naive torch: decode attention read from the
pages, however a step's decodes are split into items and grouped on shared prefixes, the fused
layer steps against the torch forms they replace (the block-quantized linear layers:
tests/test_block_kernels.py)."""
from __future__ import annotations


import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.kernels.cpu_kernels import DecodePlan, PagedDecode, load
from radixserve.runtime.models.layer_ops import CpuLayerOps, TorchLayerOps
from radixserve.runtime.models.rope import cos_sin_table

KERNELS = load()
# the machines this project runs on have g++ (the token bitmask runs here too): a kernel
# that does not build is a failure here, not a skip
assert KERNELS is not None, "the CPU kernels did not build"

KV_HEADS, HEADS, DIM = 2, 6, 16
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 1.6e-2}


def naive_decode(q, k_cache, v_cache, table, page_rows, lens, scale, window=None, sinks=None):
    """softmax(q k^T * scale) v over each row's context (its last `window` positions), in float64,
    K/V gathered token by token; `sinks`: each head's extra logit, in the softmax, weighing nothing."""
    page_size, heads, group = k_cache.shape[1], q.shape[1], q.shape[1] // k_cache.shape[2]
    out = []
    for b, (row, n) in enumerate(zip(page_rows, lens)):
        first = 0 if window is None else max(0, n - window)
        slots = [(int(table[row, t // page_size]), t % page_size) for t in range(first, n)]
        k = torch.stack([k_cache[p, o] for p, o in slots]).double()   # [n, kv_heads, dim]
        v = torch.stack([v_cache[p, o] for p, o in slots]).double()
        per_head = []
        for h in range(heads):
            scores = k[:, h // group] @ q[b, h].double() * scale
            if sinks is not None:
                scores = torch.cat([scores, sinks[h:h + 1].double()])
            w = torch.softmax(scores, dim=0)[:len(slots)]
            per_head.append(w @ v[:, h // group])
        out.append(torch.stack(per_head))
    return torch.stack(out)


def attend(q, k_cache, v_cache, table, plan, scale, sinks=None):
    """The kernel on one layer's caches [pages, page_size, kv_heads, dim]."""
    paged = PagedDecode.of(k_cache.unsqueeze(0), v_cache.unsqueeze(0), table, plan, scale)
    return KERNELS.decode_attention(q, paged, 0, sinks)


def cache_and_table(page_size: int, pages: int, dtype, seed: int = 0, kv_heads: int = KV_HEADS, dim: int = DIM):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(pages, page_size, kv_heads, dim, generator=g).to(dtype)
    return k, torch.randn(k.shape, generator=g).to(dtype)


# (heads, KV heads, head dim): GQA groups of 3, 1, 4 and 7 heads; head dims split into vector
# chunks of 64 and a remainder, and one that is not a multiple of 8 (the portable loops)
SHAPES = [(HEADS, KV_HEADS, DIM), (4, 4, 8), (8, 2, 72), (14, 2, 128), (6, 2, 12)]


@settings(max_examples=60, deadline=None)
@given(data=st.data(), page_size=st.sampled_from([1, 4, 16]), dtype=st.sampled_from([torch.float32, torch.bfloat16]),
       shape=st.sampled_from(SHAPES), with_sinks=st.booleans())
def test_decode_attention_from_pages_equals_naive_attention(data, page_size, dtype, shape, with_sinks):
    """Any mix of rows, some sharing prefix pages (read through the first member's row), long
    contexts split into several items, any GQA group and head dim, with or without attention
    sinks: every row gets softmax attention over its own context."""
    heads, kv_heads, dim = shape
    rows = data.draw(st.integers(1, 6))
    lens = data.draw(st.lists(st.integers(1, 700), min_size=rows, max_size=rows))
    max_pages = max(-(-n // page_size) for n in lens) + 2
    pool = torch.randperm(rows * max_pages + 8, generator=torch.Generator().manual_seed(len(lens)))
    table = pool[: rows * max_pages].view(rows, max_pages).clone()
    # rows sharing a prefix: same first pages in the table, all but the last page of each member
    groups = []
    by_first = data.draw(st.lists(st.integers(0, 1), min_size=rows, max_size=rows))
    for g in (0, 1):
        members = [r for r in range(rows) if by_first[r] == g]
        shared_pages = min((lens[r] - 1) // page_size for r in members) if members else 0
        if len(members) >= 2 and shared_pages >= 1:
            shared_pages = data.draw(st.integers(1, shared_pages))
            for r in members[1:]:
                table[r, :shared_pages] = table[members[0], :shared_pages]
            groups.append((members, shared_pages * page_size))
    k_cache, v_cache = cache_and_table(page_size, int(pool.max()) + 1, dtype, kv_heads=kv_heads, dim=dim)
    q = torch.randn(rows, heads, dim, generator=torch.Generator().manual_seed(3)).to(dtype)
    sinks = torch.randn(heads, generator=torch.Generator().manual_seed(4)) * 3 if with_sinks else None
    plan = DecodePlan.of(list(range(rows)), lens, groups, heads, dim)
    got = attend(q, k_cache, v_cache, table, plan, dim ** -0.5, sinks)
    want = naive_decode(q, k_cache, v_cache, table, range(rows), lens, dim ** -0.5, sinks=sinks)
    torch.testing.assert_close(got.double(), want, atol=TOLERANCE[dtype], rtol=0)


@settings(max_examples=40, deadline=None)
@given(lens=st.lists(st.integers(1, 400), min_size=1, max_size=5), window=st.integers(1, 300),
       page_size=st.sampled_from([1, 4, 16]), with_sinks=st.booleans())
def test_a_sliding_window_plan_attends_each_rows_last_window_positions(lens, window, page_size, with_sinks):
    rows = len(lens)
    max_pages = max(-(-n // page_size) for n in lens)
    table = torch.randperm(rows * max_pages, generator=torch.Generator().manual_seed(rows)).view(rows, max_pages)
    k_cache, v_cache = cache_and_table(page_size, rows * max_pages, torch.float32)
    q = torch.randn(rows, HEADS, DIM, generator=torch.Generator().manual_seed(3))
    sinks = torch.randn(HEADS, generator=torch.Generator().manual_seed(4)) * 3 if with_sinks else None
    plan = DecodePlan.of(list(range(rows)), lens, [], HEADS, DIM, window)
    assert plan.items[:, 2].sub(plan.items[:, 1]).sum() == sum(min(n, window) for n in lens)   # no position outside
    got = attend(q, k_cache, v_cache, table, plan, DIM ** -0.5, sinks)
    want = naive_decode(q, k_cache, v_cache, table, range(rows), lens, DIM ** -0.5, window, sinks)
    torch.testing.assert_close(got.double(), want, atol=TOLERANCE[torch.float32], rtol=0)


def test_a_long_context_is_split_into_items_every_thread_can_take():
    plan = DecodePlan.of([0], [3000], [], HEADS, DIM)
    assert plan.items.shape[0] >= torch.get_num_threads()
    assert plan.items[:, 1].tolist()[0] == 0 and plan.items[:, 2].tolist()[-1] == 3000


def test_a_short_context_is_split_so_that_every_thread_gets_an_item():
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        plan = DecodePlan.of([0], [130], [], HEADS, DIM)
    finally:
        torch.set_num_threads(threads)
    assert plan.items.shape[0] == 2 and plan.items[:, 2].tolist()[-1] == 130


def test_a_shared_prefix_is_one_item_list_scored_for_all_its_members():
    plan = DecodePlan.of([0, 1, 2], [100, 120, 40], [([0, 1], 64)], HEADS, DIM)
    shared_items = [it for it in plan.items.tolist() if it[4] == 2]
    assert sum(end - start for _, start, end, _, _ in shared_items) == 64
    assert all(row == 0 for row, *_ in shared_items)


def test_queries_with_strided_rows_are_read_in_place():
    """q as the model hands it: a view into the fused qkv rows."""
    k_cache, v_cache = cache_and_table(4, 8, torch.float32)
    table = torch.arange(8).view(1, 8)
    qkv = torch.randn(1, (HEADS + 2 * KV_HEADS) * DIM)
    q = qkv[:, : HEADS * DIM].view(1, HEADS, DIM)
    plan = DecodePlan.of([0], [30], [], HEADS, DIM)
    got = attend(q, k_cache, v_cache, table, plan, 0.25)
    torch.testing.assert_close(got.double(), naive_decode(q, k_cache, v_cache, table, [0], [30], 0.25),
                               atol=1e-5, rtol=0)


def test_decode_attention_reads_the_caches_of_the_layer_it_is_given():
    layers = [cache_and_table(4, 8, torch.float32, seed=s) for s in range(3)]
    k, v = torch.stack([k for k, _ in layers]), torch.stack([v for _, v in layers])
    table = torch.arange(8).view(1, 8)
    q = torch.randn(1, HEADS, DIM)
    paged = PagedDecode.of(k, v, table, DecodePlan.of([0], [30], [], HEADS, DIM), 0.25)
    for layer in range(3):
        torch.testing.assert_close(KERNELS.decode_attention(q, paged, layer).double(),
                                   naive_decode(q, k[layer], v[layer], table, [0], [30], 0.25), atol=1e-5, rtol=0)


def test_write_kv_puts_each_row_in_its_slot():
    k_cache = torch.zeros(4, 2, KV_HEADS, DIM)
    v_cache = torch.zeros_like(k_cache)
    qkv = torch.randn(3, 3 * KV_HEADS * DIM)
    k = qkv[:, KV_HEADS * DIM: 2 * KV_HEADS * DIM].view(3, KV_HEADS, DIM)
    v = qkv[:, 2 * KV_HEADS * DIM:].view(3, KV_HEADS, DIM)
    KERNELS.write_kv(k_cache, v_cache, torch.tensor([5, 0, 7]), k, v)
    flat_k, flat_v = k_cache.view(-1, KV_HEADS, DIM), v_cache.view(-1, KV_HEADS, DIM)
    assert torch.equal(flat_k[[5, 0, 7]], k) and torch.equal(flat_v[[5, 0, 7]], v)
    assert flat_k[[1, 2, 3, 4, 6]].abs().sum() == 0


# ---- fused layer steps: bfloat16 bit for bit, float32 to a few ulps ---------------------------------
def assert_same_as_torch(got: torch.Tensor, want: torch.Tensor) -> None:
    if got.dtype == torch.bfloat16:
        assert torch.equal(got, want)
    else:   # values of order 1; where a sum cancels to ~0 the last bits differ (FMA or not)
        torch.testing.assert_close(got, want, atol=1e-7, rtol=4e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_delta", [True, False])
def test_add_rms_norm_equals_torch(dtype, with_delta):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(20, 576, generator=g) * 3
    delta = torch.randn(20, 576, generator=g).to(dtype) if with_delta else None
    w = torch.randn(576, generator=g)
    want_x, want_h = TorchLayerOps().add_rms_norm(x.clone(), delta, w, 1e-5, dtype)
    got_x, got_h = CpuLayerOps(KERNELS).add_rms_norm(x.clone(), delta, w, 1e-5, dtype)
    assert torch.equal(got_x, want_x)
    assert_same_as_torch(got_h, want_h)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_in_place_equals_torch(dtype):
    cos, sin = cos_sin_table(DIM, 10000.0, None, 4096, dtype, "cpu")
    positions = torch.tensor([0, 1, 17, 1000, 4095])
    qkv = torch.randn(5, (HEADS + 2 * KV_HEADS) * DIM).to(dtype)
    qk = qkv[:, : (HEADS + KV_HEADS) * DIM].view(5, HEADS + KV_HEADS, DIM)
    torch_ops, cpu_ops = TorchLayerOps(), CpuLayerOps(KERNELS)
    want = torch_ops.rope(qk, torch_ops.rope_positions(cos, sin, positions))
    v_before = qkv[:, (HEADS + KV_HEADS) * DIM:].clone()
    got = cpu_ops.rope(qk, cpu_ops.rope_positions(cos, sin, positions))
    assert_same_as_torch(got, want)
    assert torch.equal(qkv[:, (HEADS + KV_HEADS) * DIM:], v_before)   # v is not touched


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul_equals_torch(dtype):
    gate_up = (torch.randn(20, 2 * 1536, generator=torch.Generator().manual_seed(0)) * 4).to(dtype)
    got = CpuLayerOps(KERNELS).silu_mul(gate_up)
    want = TorchLayerOps().silu_mul(gate_up)
    if dtype == torch.bfloat16:
        assert torch.equal(got, want)
    else:   # exp2 polynomial vs libm exp: a few ulps
        torch.testing.assert_close(got, want, atol=1e-6, rtol=2e-6)


def test_silu_mul_gives_the_same_bits_eight_values_at_a_time_as_one_at_a_time():
    # a row of one value takes the scalar loop; a row of 1,029 takes eight lanes, then a tail of 5
    g = torch.randn(1029, generator=torch.Generator().manual_seed(1)) * 30
    u = torch.randn(1029, generator=torch.Generator().manual_seed(2))
    wide = KERNELS.silu_mul(torch.cat([g, u]).view(1, -1))
    one_by_one = KERNELS.silu_mul(torch.stack([g, u], dim=1))
    assert torch.equal(wide.view(-1), one_by_one.view(-1))
