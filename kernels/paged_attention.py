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
                     kv_rows: torch.Tensor, mask: Optional[torch.Tensor], scale: float,
                     shared_kv_rows: Optional[torch.Tensor] = None) -> torch.Tensor:
    """One query per request. q: [B, heads, dim]; kv_rows: `decode_kv_rows` of the requests'
    page-table rows (padded with a zeroed page); mask: [B, 1, 1, n * page_size], True where a
    position is in the context.

    shared_kv_rows: [kv_heads, S], the rows of a cached prefix that every request of the batch
    has at positions [0, S); kv_rows then covers only each request's positions after it. The
    prefix is gathered once and all queries attend to it in one matmul per KV head, instead of
    every request gathering its own copy (the cost of decoding many requests under one long
    system prompt).
    """
    b, kv_heads, length = kv_rows.shape
    heads, dim = q.shape[1], q.shape[2]
    group = heads // kv_heads
    # Gathered head-major, so that each (request, KV head) has its keys contiguous: the batched
    # matmuls below then run ~6x faster than on a [B, length, kv_heads, dim] gather, and ~2x
    # faster than CPU SDPA, whose one-row-per-head flash path is slow in bf16 (measured here).
    k = _gather_rows(k_cache, kv_rows).view(b, kv_heads, length, dim)
    v = _gather_rows(v_cache, kv_rows).view(b, kv_heads, length, dim)
    # the query heads that share a KV head are rows of one query
    qg = q.view(b, kv_heads, group, dim)
    scores = torch.matmul(qg, k.transpose(-1, -2))
    if shared_kv_rows is not None:
        s = shared_kv_rows.shape[1]
        k_shared = _gather_rows(k_cache, shared_kv_rows).view(kv_heads, s, dim)
        q_rows = qg.transpose(0, 1).reshape(kv_heads, b * group, dim)
        shared_scores = torch.matmul(q_rows, k_shared.transpose(-1, -2)).view(kv_heads, b, group, s)
        scores = torch.cat([shared_scores.transpose(0, 1), scores], dim=-1)
    scores = scores.float().mul_(scale)
    if mask is not None:
        scores[..., scores.shape[-1] - length:].masked_fill_(~mask, float("-inf"))
    probs = scores.softmax(-1).to(q.dtype)
    if shared_kv_rows is None:
        return torch.matmul(probs, v).view(q.shape)
    v_shared = _gather_rows(v_cache, shared_kv_rows).view(kv_heads, s, dim)
    p_shared = probs[..., :s].transpose(0, 1).reshape(kv_heads, b * group, s)
    out = torch.matmul(p_shared, v_shared).view(kv_heads, b, group, dim).transpose(0, 1).float()
    # the two halves are summed in float32: one more bf16 rounding than a single matmul, not two
    out += torch.matmul(probs[..., s:], v).float()
    return out.to(q.dtype).reshape(q.shape)


def _gather_rows(cache: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Rows of a cache viewed as [slots * kv_heads, dim]."""
    return cache.reshape(-1, cache.shape[-1]).index_select(0, rows.reshape(-1))


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
