"""Plain-torch decode attention over a shared cached prefix, and how decodes are grouped for it."""
from __future__ import annotations

import pytest
import torch

from kernels.paged_attention import decode_attention, decode_kv_rows
from runtime.model_runner import MIN_SHARED_DECODE_SAVING, shared_prefix_groups
from runtime.request import OutputStream, Request
from runtime.sampling_params import SamplingParams

PAGE, KV_HEADS, HEADS, DIM = 4, 2, 6, 16


def paged_cache(pages: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    k = torch.randn(pages, PAGE, KV_HEADS, DIM, generator=g).to(dtype)
    return k, torch.randn(k.shape, generator=g).to(dtype)


def whole_context(page_rows: torch.Tensor, lens: torch.Tensor):
    """kv_rows and mask of each request's whole context, the unshared reference layout."""
    mask = (torch.arange(page_rows.shape[1] * PAGE) < lens.unsqueeze(1))[:, None, None, :]
    return decode_kv_rows(page_rows, PAGE, KV_HEADS), mask


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_decode_over_a_shared_prefix_equals_attending_each_whole_context(dtype, atol):
    k_cache, v_cache = paged_cache(40, dtype)
    shared = torch.tensor([7, 3, 30, 12, 5])                      # 5 pages every request starts with
    own = torch.tensor([[20, 21, 0], [22, 23, 24], [25, 0, 0]])   # 0: the padding page
    lens = torch.tensor([5 * PAGE + 6, 5 * PAGE + 11, 5 * PAGE + 1])
    q = torch.randn(3, HEADS, DIM, generator=torch.Generator().manual_seed(1)).to(dtype)
    scale = DIM ** -0.5

    rows, mask = whole_context(torch.cat([shared.expand(3, -1), own], dim=1), lens)
    want = decode_attention(q, k_cache, v_cache, rows, mask, scale)
    own_rows, own_mask = whole_context(own, lens - 5 * PAGE)
    got = decode_attention(q, k_cache, v_cache, own_rows, own_mask, scale,
                           shared_kv_rows=decode_kv_rows(shared[None], PAGE, KV_HEADS)[0])
    torch.testing.assert_close(got.float(), want.float(), atol=atol, rtol=0)


def decoding(pages: list[int], kv_len: int) -> Request:
    req = Request("r", list(range(kv_len + 1)), SamplingParams(), OutputStream("r"))
    req.pages, req.kv_len = pages, kv_len
    return req


def test_decodes_on_the_same_cached_pages_form_one_group_sharing_them():
    p = 16
    system = list(range(100, 100 + 160))               # 160 pages = 2,560 tokens
    reqs = [decoding(system + [1, 2], 160 * p + 20), decoding([50, 51], 20),
            decoding(system[:150] + [3, 4, 5], 150 * p + 40), decoding(system + [6], 160 * p + 3)]
    assert shared_prefix_groups(reqs, p) == [([0, 2, 3], 150), ([1], 0)]


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
    assert shared_prefix_groups(reqs, p) == [([0, 1, 2], 0)]
    reqs.append(decoding(system + [99], pages * p + 4))  # a fourth member tips it over
    assert shared_prefix_groups(reqs, p) == [([0, 1, 2, 3], pages)]
