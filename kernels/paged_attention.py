"""Paged attention in plain torch: K/V are read from the cache through page and slot indices.

Caches are [pages, page_size, kv_heads, dim]; slot s is (page s // page_size, offset s % page_size).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F

LOG2_E = math.log2(math.e)


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


def attention_bias(attend: torch.Tensor) -> torch.Tensor:
    """Additive float32 scores bias from a boolean mask: 0 where True, -inf where False. Built once
    a step; adding it is one op per layer where masked_fill on the mask's inverse takes two."""
    return torch.zeros(attend.shape, dtype=torch.float32, device=attend.device).masked_fill_(~attend, float("-inf"))


@dataclass
class SharedPrefixes:
    """Cached prefixes that groups of decode rows share (the torch decode path): each group's
    prefix is gathered once and scored against all its members' queries in one matmul."""
    kv_rows: torch.Tensor            # [G, kv_heads, S] cache rows of each prefix (padded)
    bias: torch.Tensor               # [G, 1, 1, S] `attention_bias`: 0 in the prefix, -inf past it
    members: torch.Tensor            # [G, M] decode row of each member (a short group repeats one)
    slot_of_row: torch.Tensor        # [B] each decode row's index in members.view(-1) (0 if none)
    in_group: torch.Tensor           # [B, 1, 1, 1] True for rows that have a shared prefix


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     kv_rows: torch.Tensor, bias: torch.Tensor, scale: float,
                     shared: Optional[SharedPrefixes] = None) -> torch.Tensor:
    """One query per request. q: [B, heads, dim]; kv_rows: `decode_kv_rows` of the requests'
    page-table rows (padded with a zeroed page); bias: [B, 1, 1, n * page_size] `attention_bias`,
    0 where a position is in the context, -inf past its end.

    With `shared`, kv_rows covers only each row's positions after its group's prefix; the two
    parts are attended separately and merged by their softmax normalisers.
    """
    b, kv_heads, length = kv_rows.shape
    heads, dim = q.shape[1], q.shape[2]
    group = heads // kv_heads
    # Keys gathered head-major, so that each (request, KV head) has its keys contiguous: the
    # batched matmul below then runs ~6x faster than on a [B, length, kv_heads, dim] gather, and
    # the whole ~2x faster than CPU SDPA, whose one-row-per-head flash path is slow in bf16
    # (measured here). Values are never gathered (`_weighted_values`).
    k = _gather_rows(k_cache, kv_rows).view(b, kv_heads, length, dim)
    # the query heads that share a KV head are rows of one query
    qg = q.view(b, kv_heads, group, dim)
    if shared is None:
        return _weighted_values(_scaled_scores(qg, k, bias, scale).softmax(-1), v_cache, kv_rows).view(q.shape)

    # Both parts are scored in base 2 (scale * log2(e)) and weighted with exp2, which runs ~3x
    # faster than exp on the CPU here; softmax's own exp above is already fast.
    scale = scale * LOG2_E
    own_out, own_max, own_sum = _unnormalised(_scaled_scores(qg, k, bias, scale),
                                              lambda p: _weighted_values(p, v_cache, kv_rows))
    n_groups, members = shared.members.shape
    s = shared.kv_rows.shape[-1]
    k_shared = _gather_rows(k_cache, shared.kv_rows).view(n_groups, kv_heads, s, dim)
    v_shared = _gather_rows(v_cache, shared.kv_rows).view(n_groups, kv_heads, s, dim)
    q_shared = (qg.index_select(0, shared.members.view(-1)).view(n_groups, members, kv_heads, group, dim)
                .transpose(1, 2).reshape(n_groups, kv_heads, members * group, dim))
    shared_scores = _scaled_scores(q_shared, k_shared, shared.bias, scale)
    # out, max and sum of each (group, member) in one tensor, moved to the rows' layout at once
    per_member = torch.cat(_unnormalised(shared_scores, lambda p: torch.matmul(p.to(v_shared.dtype), v_shared)),
                           dim=-1)
    per_member = (per_member.view(n_groups, kv_heads, members, group, dim + 2).transpose(1, 2)
                  .reshape(n_groups * members, kv_heads, group, dim + 2))
    per_row = per_member.index_select(0, shared.slot_of_row)
    shared_out, shared_max, shared_sum = per_row.split([dim, 1, 1], dim=-1)
    shared_max = shared_max.masked_fill(~shared.in_group, float("-inf"))  # rows without a prefix
    top = torch.maximum(own_max, shared_max)
    own_weight, shared_weight = (own_max - top).exp2_(), (shared_max - top).exp2_()
    out = (own_out * own_weight + shared_out * shared_weight) / (own_sum * own_weight + shared_sum * shared_weight)
    return out.to(q.dtype).view(q.shape)


def _scaled_scores(q: torch.Tensor, k: torch.Tensor, bias: torch.Tensor, scale: float) -> torch.Tensor:
    """float32 bias + scale * q k^T (one op after the matmul: add promotes bf16 scores itself)."""
    if not bias.is_floating_point():  # a bool mask would be added as 0 / 1
        raise TypeError("attention bias must be float (attention_bias of the mask), got " + str(bias.dtype))
    return torch.add(bias, torch.matmul(q, k.transpose(-1, -2)), alpha=scale)


def _unnormalised(scores: torch.Tensor, weigh_values: Callable[[torch.Tensor], torch.Tensor]
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """weigh_values(p) with p = 2 ** (scores - max), the max and p's sum over the last axis, all
    float32, for base-2 scores (every row has a finite score). Overwrites `scores`."""
    top = scores.amax(-1, keepdim=True)
    p = scores.sub_(top).exp2_()
    return weigh_values(p).float(), top, p.sum(-1, keepdim=True)


def _weighted_values(p: torch.Tensor, v_cache: torch.Tensor, kv_rows: torch.Tensor) -> torch.Tensor:
    """p @ V for p [B, kv_heads, group, L] and V the cache rows kv_rows [B, kv_heads, L], without
    gathering V: embedding_bag sums the weighted rows in place (~25% faster than gather + matmul
    at batch 32, measured here). Returns [B, kv_heads, group, dim] in the cache's dtype."""
    b, kv_heads, group, length = p.shape
    bags = kv_rows.unsqueeze(2).expand(b, kv_heads, group, length).reshape(-1, length)
    out = F.embedding_bag(bags, v_cache.reshape(-1, v_cache.shape[-1]), mode="sum",
                          per_sample_weights=p.reshape(-1, length).to(v_cache.dtype))
    return out.view(b, kv_heads, group, -1)


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
