"""Decode attention over shared prompt prefixes (cascade) equals plain paged decode attention."""
from types import SimpleNamespace

import pytest
import torch

from kernels.paged_attention import cascade_decode_attention, decode_attention
from runtime.forward_batch import SharedPrefixGroup
from runtime.model_runner import shared_prefix_groups

PAD = 39


def padded(tables, lengths, page_size):
    width = max(len(t) for t in tables)
    pages = torch.tensor([t + [PAD] * (width - len(t)) for t in tables])
    mask = (torch.arange(width * page_size) < torch.tensor(lengths)[:, None])[:, None, None, :]
    return pages, mask


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("page_size", [1, 4])
def test_cascade_decode_attention_equals_paged_decode_attention(dtype, tol, page_size):
    torch.manual_seed(0)
    kv_heads, group, dim = 3, 3, 16
    k_cache = torch.randn(PAD + 1, page_size, kv_heads, dim, dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    k_cache[PAD] = 0
    v_cache[PAD] = 0
    # decodes 0-2 share pages 0-2, decodes 3-4 share page 11, decode 5 shares nothing
    tables = [[0, 1, 2, 5, 6], [0, 1, 2, 7], [0, 1, 2, 8, 9, 10], [11, 12], [11, 13, 14], [15]]
    lengths = [4 * page_size + 1, 3 * page_size + 1, 6 * page_size, 2 * page_size, 2 * page_size + 1, 1]
    shared = [3, 3, 3, 1, 1, 0]
    q = torch.randn(len(tables), kv_heads * group, dim, dtype=dtype)
    scale = dim ** -0.5

    pages, mask = padded(tables, lengths, page_size)
    expected = decode_attention(q, k_cache, v_cache, pages, mask, scale)

    own_pages, own_mask = padded([t[s:] for t, s in zip(tables, shared)],
                                 [n - s * page_size for n, s in zip(lengths, shared)], page_size)
    groups = [SharedPrefixGroup(torch.tensor([0, 1, 2]), torch.tensor([0, 1, 2])),
              SharedPrefixGroup(torch.tensor([3, 4]), torch.tensor([11]))]
    got = cascade_decode_attention(q, k_cache, v_cache, own_pages, own_mask, groups, scale)
    torch.testing.assert_close(got.float(), expected.float(), rtol=tol, atol=tol)


def test_shared_prefix_groups_find_common_leading_pages():
    reqs = [SimpleNamespace(pages=p) for p in ([0, 1, 2, 3, 9], [0, 1, 2, 4], [0, 1, 5], [7, 8], [6])]
    assert shared_prefix_groups(reqs, page_size=256) == [([0, 1, 2], 2)]


def test_shared_prefix_groups_skip_prefixes_too_short_to_pay_off():
    reqs = [SimpleNamespace(pages=p) for p in ([0, 1], [0, 2])]
    assert shared_prefix_groups(reqs, page_size=16) == []
