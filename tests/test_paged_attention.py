"""Plain-torch paged attention: decodes over shared cached prefixes (and how decodes are grouped
for them), and extends after a cached prefix."""
from __future__ import annotations

import pytest
import torch

from radixserve.kernels.paged_attention import (SharedPrefixes, attention_bias, decode_attention, decode_kv_rows,
                                                extend_attention, extend_context, scored_extend_attention)
from radixserve.runtime.attention_torch import MIN_GROUP_SAVING, MIN_SHARED_DECODE_SAVING, shared_prefix_groups
from radixserve.runtime.forward_batch import DecodeSeq

PAGE, KV_HEADS, HEADS, DIM = 4, 2, 6, 16


def paged_cache(pages: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    k = torch.randn(pages, PAGE, KV_HEADS, DIM, generator=g).to(dtype)
    return k, torch.randn(k.shape, generator=g).to(dtype)


def whole_context(page_rows: torch.Tensor, lens: torch.Tensor):
    """kv_rows and attention bias of each request's whole context, the unshared reference layout."""
    attend = (torch.arange(page_rows.shape[1] * PAGE) < lens.unsqueeze(1))[:, None, None, :]
    return decode_kv_rows(page_rows, PAGE, KV_HEADS), attention_bias(attend)


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("prefix_of", [[0, 1, 0, 1, None], [0, 1, 0, 0, 1], [0, 0, 0, 0, 0]],
                         ids=["one-row-without-prefix", "groups-of-3-and-2", "one-group"])
def test_decode_over_shared_prefixes_equals_attending_each_whole_context(dtype, atol, prefix_of):
    k_cache, v_cache = paged_cache(40, dtype)
    prefixes = [[7, 3, 30, 12, 5], [9, 14]]
    own = [[20, 21], [22, 23, 24], [25], [26, 27], [28, 29, 31]]
    tail = [3, 2, 1, 4, 2]   # positions each row uses in its last own page (PAGE = 4)
    q = torch.randn(5, HEADS, DIM, generator=torch.Generator().manual_seed(1)).to(dtype)
    scale = DIM ** -0.5

    whole = [(prefixes[g] if g is not None else []) + o for g, o in zip(prefix_of, own)]
    lens = torch.tensor([(len(w) - 1) * PAGE + t for w, t in zip(whole, tail)])
    rows, bias = whole_context(padded(whole), lens)
    want = decode_attention(q, k_cache, v_cache, rows, bias, scale)

    used = sorted({g for g in prefix_of if g is not None})
    own_lens = torch.tensor([(len(o) - 1) * PAGE + t for o, t in zip(own, tail)])
    own_rows, own_bias = whole_context(padded(own), own_lens)
    prefix_rows, prefix_bias = whole_context(padded([prefixes[g] for g in used]),
                                             torch.tensor([len(prefixes[g]) * PAGE for g in used]))
    groups = [[i for i, g in enumerate(prefix_of) if g == n] for n in used]
    shared = SharedPrefixes.of_groups(prefix_rows, prefix_bias, groups, len(own), HEADS // KV_HEADS)
    got = decode_attention(q, k_cache, v_cache, own_rows, own_bias, scale, shared)
    torch.testing.assert_close(got.float(), want.float(), atol=atol, rtol=0)


def padded(page_lists: list[list[int]]) -> torch.Tensor:
    """Page-table rows, padded with page 0."""
    width = max(map(len, page_lists))
    return torch.tensor([pages + [0] * (width - len(pages)) for pages in page_lists])


def decoding(pages: list[int], kv_len: int) -> DecodeSeq:
    return DecodeSeq(page_row=0, context_len=kv_len + 1, pages=pages)


def test_decodes_on_the_same_cached_pages_form_one_group_sharing_them():
    p = 16
    system = list(range(100, 100 + 160))               # 160 pages = 2,560 tokens
    reqs = [decoding(system + [1, 2], 160 * p + 20), decoding([50, 51], 20),
            decoding(system[:150] + [3, 4, 5], 150 * p + 40), decoding(system + [6], 160 * p + 3)]
    assert shared_prefix_groups(reqs, p) == [([0, 2, 3], 150)]


def test_the_page_a_request_is_writing_is_never_shared():
    p = 16
    system = list(range(100, 100 + 200))
    # the second request's newest position is in page 199: pages 0-198 at most may be shared
    reqs = [decoding(system + [1], 200 * p + 5), decoding(system, 199 * p + 3), decoding(system + [2], 200 * p + 9)]
    assert shared_prefix_groups(reqs, p) == [([0, 1, 2], 199)]


def test_sharing_that_saves_little_work_is_left_to_per_request_attention():
    p = 16
    pages = MIN_SHARED_DECODE_SAVING // p // 3 + 1   # three members save 2 x that: too little; four, 3 x
    system = list(range(100, 100 + pages))
    reqs = [decoding(system + [90 + i], pages * p + 4) for i in range(3)]
    assert shared_prefix_groups(reqs, p) == []
    reqs.append(decoding(system + [99], pages * p + 4))  # a fourth member tips it over
    assert shared_prefix_groups(reqs, p) == [([0, 1, 2, 3], pages)]


def test_the_savings_of_several_groups_add_up_but_a_tiny_group_is_left_out():
    p = 16
    pages = MIN_SHARED_DECODE_SAVING // p // 2       # each pair saves half the threshold
    a, b = list(range(1000, 1000 + pages)), list(range(2000, 2000 + pages))
    tiny = list(range(3000, 3000 + MIN_GROUP_SAVING // p - 1))  # a pair sharing these saves too little
    reqs = [decoding(a + [1], pages * p + 2), decoding(b + [2], pages * p + 2), decoding(tiny + [3], len(tiny) * p + 1),
            decoding(a + [4], pages * p + 5), decoding(b + [5], pages * p + 7), decoding(tiny + [6], len(tiny) * p + 9)]
    assert shared_prefix_groups(reqs, p) == [([0, 3], pages), ([1, 4], pages)]


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("prefix_len,lens", [(9, [1]), (13, [6]), (40, [17]), (12, [5, 1, 9])],
                         ids=["one-token", "short", "longer", "three-segments-one-prefix"])
def test_scored_extend_equals_sdpa_extend_of_each_segment(dtype, atol, prefix_len, lens):
    k_cache, v_cache = paged_cache(40, dtype)
    g = torch.Generator().manual_seed(prefix_len)
    slots = torch.randperm(40 * PAGE, generator=g)
    prefix, new = slots[:prefix_len], list(slots[prefix_len: prefix_len + sum(lens)].split(lens))
    q = torch.randn(sum(lens), HEADS, DIM, generator=g).to(dtype)
    scale = DIM ** -0.5
    want, start = [], 0
    for seg in new:   # each segment alone, through SDPA (its new tokens' K/V are already in the cache)
        rows = slice(start, start + seg.shape[0])
        k_new, v_new = k_cache.view(-1, KV_HEADS, DIM)[seg], v_cache.view(-1, KV_HEADS, DIM)[seg]
        want.append(extend_attention(q[rows], k_new, v_new, k_cache, v_cache, torch.cat([prefix, seg]), prefix_len,
                                     scale))
        start += seg.shape[0]
    context = extend_context(prefix, new, KV_HEADS, HEADS)
    assert context is not None
    got = scored_extend_attention(q, k_cache, v_cache, context, scale)
    torch.testing.assert_close(got.float(), torch.cat(want).float(), atol=atol, rtol=0)


def test_long_extends_and_extends_without_a_prefix_take_sdpa():
    import radixserve.kernels.paged_attention as pa
    assert extend_context(torch.arange(0), [torch.arange(300)], KV_HEADS, HEADS) is None
    n = pa.MAX_SCORED_EXTEND // (HEADS * 4096) + 1
    assert extend_context(torch.arange(4096 - n), [torch.arange(n)], KV_HEADS, HEADS) is None
    assert extend_context(torch.arange(4096 - 16), [torch.arange(16)], KV_HEADS, HEADS) is not None
