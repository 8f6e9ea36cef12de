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


def decode_kv_rows(pages: torch.Tensor, page_size: int, kv_heads: int) -> torch.Tensor:
    """[B, kv_heads, n * page_size]: the row of each (request, KV head, position) in a cache viewed
    as [slots * kv_heads, dim], for page-table rows `pages` [B, n]. Built once per step."""
    b, n = pages.shape
    offsets = torch.arange(page_size, device=pages.device)
    slots = (pages.unsqueeze(-1) * page_size + offsets).view(b, 1, n * page_size)
    return slots * kv_heads + torch.arange(kv_heads, device=pages.device).view(1, kv_heads, 1)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     kv_rows: torch.Tensor, mask: Optional[torch.Tensor], scale: float) -> torch.Tensor:
    """One query per request. q: [B, heads, dim]; kv_rows: `decode_kv_rows` of the requests'
    page-table rows (padded with a zeroed page); mask: [B, 1, 1, n * page_size], True where a
    position is in the context."""
    b, kv_heads, length = kv_rows.shape
    heads, dim = q.shape[1], q.shape[2]
    rows = kv_rows.reshape(-1)
    # Gathered head-major, so that each (request, KV head) has its keys contiguous: the batched
    # matmuls below then run ~6x faster than on a [B, length, kv_heads, dim] gather, and ~2x
    # faster than CPU SDPA, whose one-row-per-head flash path is slow in bf16 (measured here).
    k = k_cache.reshape(-1, dim).index_select(0, rows).view(b, kv_heads, length, dim)
    v = v_cache.reshape(-1, dim).index_select(0, rows).view(b, kv_heads, length, dim)
    # the query heads that share a KV head are rows of one query
    scores = torch.matmul(q.view(b, kv_heads, heads // kv_heads, dim), k.transpose(-1, -2)).float()
    scores.mul_(scale)
    if mask is not None:
        scores.masked_fill_(~mask, float("-inf"))
    probs = scores.softmax(-1).to(q.dtype)
    return torch.matmul(probs, v).view(q.shape)


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
