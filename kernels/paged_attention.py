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
    out = F.scaled_dot_product_attention(q.unsqueeze(2), k, v, attn_mask=mask, scale=scale,
                                         enable_gqa=q.shape[1] != k.shape[1])
    return out.squeeze(2)


def _attend_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: Optional[torch.Tensor],
                     scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [B, kv_heads, n, dim] (the query heads of one KV head as a sequence, so no GQA expansion),
    k/v: [B, kv_heads, L, dim] -> (out [B, kv_heads, n, dim], float32 log-sum-exp [B, kv_heads, n])."""
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, False, attn_mask=bias, scale=scale)[:2]
    return out, lse


def cascade_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                             pages: torch.Tensor, mask: torch.Tensor, groups, scale: float) -> torch.Tensor:
    """Decode attention where groups of requests share their leading pages (a common prompt).

    Each request attends to its own pages (`pages`/`mask`: what follows its group's prefix) and
    each group's queries attend together to the shared pages, read once; the two partial results
    are merged by their log-sum-exp. `groups`: objects with `members` (decode rows) and `pages`.
    """
    b, heads, d = q.shape
    kv_heads = k_cache.shape[2]
    g = heads // kv_heads
    n = pages.shape[1]
    length = n * k_cache.shape[1]
    flat = pages.reshape(-1)
    k = k_cache.index_select(0, flat).view(b, length, kv_heads, d).transpose(1, 2)
    v = v_cache.index_select(0, flat).view(b, length, kv_heads, d).transpose(1, 2)
    bias = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill_(~mask, float("-inf"))
    out, lse = _attend_with_lse(q.view(b, kv_heads, g, d), k, v, bias, scale)
    out = out.float()
    for group in groups:
        m = group.members
        count = m.numel()
        ks = k_cache.index_select(0, group.pages).view(1, -1, kv_heads, d).transpose(1, 2)
        vs = v_cache.index_select(0, group.pages).view(1, -1, kv_heads, d).transpose(1, 2)
        # every member's query heads of one KV head become one query sequence against the prefix
        qg = q.index_select(0, m).view(count, kv_heads, g, d).transpose(0, 1).reshape(1, kv_heads, count * g, d)
        o_s, l_s = _attend_with_lse(qg, ks, vs, None, scale)
        o_s = o_s.view(kv_heads, count, g, d).transpose(0, 1).float()
        l_s = l_s.view(kv_heads, count, g).transpose(0, 1)
        o_own, l_own = out.index_select(0, m), lse.index_select(0, m)
        top = torch.maximum(l_own, l_s)
        w_own, w_s = (l_own - top).exp().unsqueeze(-1), (l_s - top).exp().unsqueeze(-1)
        out.index_copy_(0, m, (o_own * w_own + o_s * w_s) / (w_own + w_s))
    return out.view(b, heads, d).to(q.dtype)


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
