"""Paged attention in plain torch: K/V are read from the cache through page and slot indices.

Caches are [pages, page_size, kv_heads, dim]; slot s is (page s // page_size, offset s % page_size).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def _flat(cache: torch.Tensor) -> torch.Tensor:
    return cache.view(-1, *cache.shape[2:])


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
             k: torch.Tensor, v: torch.Tensor) -> None:
    """k, v: [T, kv_heads, dim] go to `slots`."""
    _flat(k_cache).index_copy_(0, slots, k)
    _flat(v_cache).index_copy_(0, slots, v)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     pages: torch.Tensor, mask: Optional[torch.Tensor], scale: float) -> torch.Tensor:
    """One query per request. q: [B, heads, dim]; pages: [B, n] page-table rows (padded with a
    zeroed page); mask: [B, 1, 1, n * page_size], True where a position is in the context."""
    b, n = pages.shape
    length = n * k_cache.shape[1]
    flat = pages.reshape(-1)  # whole pages per copy: ~2x the bandwidth of per-slot gathers
    k = k_cache.index_select(0, flat).view(b, length, *k_cache.shape[2:]).transpose(1, 2)
    v = v_cache.index_select(0, flat).view(b, length, *v_cache.shape[2:]).transpose(1, 2)
    # The query heads that share a KV head go in as rows of one query: the same maths as
    # enable_gqa, but CPU flash attention with a single query row per head is ~6x slower in
    # bf16 without AMX (measured here, batch 32 x 300 context).
    heads, kv_heads = q.shape[1], k.shape[1]
    out = F.scaled_dot_product_attention(q.view(b, kv_heads, heads // kv_heads, q.shape[2]), k, v,
                                         attn_mask=mask, scale=scale)
    return out.view(q.shape)


def extend_attention(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
                     k_cache: torch.Tensor, v_cache: torch.Tensor,
                     context_slots: Optional[torch.Tensor], prefix_len: int, scale: float) -> torch.Tensor:
    """New tokens of one request: causal over themselves, full over the cached prefix.

    q: [n, heads, dim]; k_new/v_new: [n, kv_heads, dim]; context_slots: [prefix_len + n] (their K/V
    already written) or None when there is no prefix.
    """
    n = q.shape[0]
    if prefix_len == 0:
        k, v = k_new, v_new
    else:
        k = _flat(k_cache).index_select(0, context_slots)
        v = _flat(v_cache).index_select(0, context_slots)
    qh, kh, vh = q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0)
    gqa = q.shape[1] != k.shape[1]
    if prefix_len == 0:
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=n > 1, scale=scale, enable_gqa=gqa)
    else:
        rows = torch.arange(n, device=q.device).unsqueeze(1) + prefix_len
        mask = torch.arange(prefix_len + n, device=q.device).unsqueeze(0) <= rows
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale, enable_gqa=gqa)
    return out.squeeze(0).transpose(0, 1)
