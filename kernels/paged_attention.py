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


def value_bags(kv_rows: torch.Tensor, group: int) -> torch.Tensor:
    """[B * kv_heads * group, L]: the cache rows each query head weighs in `_weighted_values`, for
    `decode_kv_rows` [B, kv_heads, L] and `group` query heads per KV head. Built once per step."""
    b, kv_heads, length = kv_rows.shape
    return kv_rows.unsqueeze(2).expand(b, kv_heads, group, length).reshape(-1, length)


@dataclass
class SharedPrefixes:
    """Cached prefixes that groups of decode rows share (the torch decode path): each group's
    prefix is gathered once and scored against all its members' queries in one matmul."""
    kv_rows: torch.Tensor            # [G, kv_heads, S] cache rows of each prefix (padded)
    bias: torch.Tensor               # [G, 1, 1, S] `attention_bias`: 0 in the prefix, -inf past it
    members: torch.Tensor            # [G, M] decode row of each member (a short group repeats one)
    # [B * kv_heads * group]: where each (row, KV head, query head) finds its result among the
    # groups' results (any valid one for a row without a prefix)
    result_rows: torch.Tensor
    outside: Optional[torch.Tensor]  # [B, 1, 1] True for rows without a shared prefix; None if none
    # layer -> the prefixes' K and V [G, kv_heads, S, dim], gathered on first use. The caller may
    # hand the same dict to the next step's SharedPrefixes when its prefixes are the same pages.
    # None: nothing is kept, each layer gathers its own (prefixes too large to hold for all layers).
    layer_kv: Optional[dict] = None

    def gathered(self, layer: int, k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The prefixes' K and V in `layer`, whose caches are k_cache / v_cache."""
        kv = None if self.layer_kv is None else self.layer_kv.get(layer)
        if kv is None:
            shape = (*self.kv_rows.shape, k_cache.shape[-1])
            kv = (_gather_rows(k_cache, self.kv_rows).view(shape), _gather_rows(v_cache, self.kv_rows).view(shape))
            if self.layer_kv is not None:
                self.layer_kv[layer] = kv
        return kv

    @classmethod
    def of_groups(cls, kv_rows: torch.Tensor, bias: torch.Tensor, groups: list[list[int]], num_rows: int,
                  query_group: int, layer_kv: Optional[dict] = None) -> "SharedPrefixes":
        """Prefixes `kv_rows` / `bias` shared by the decode rows listed in `groups` (one list per
        prefix) out of `num_rows`; `query_group` query heads per KV head; `layer_kv` as the field."""
        dev, kv_heads, size = kv_rows.device, kv_rows.shape[1], max(map(len, groups))
        group_of_row, member_of_row, in_group = [0] * num_rows, [0] * num_rows, [False] * num_rows
        for g, members in enumerate(groups):
            for m, i in enumerate(members):
                group_of_row[i], member_of_row[i], in_group[i] = g, m, True
        g = torch.tensor(group_of_row).view(-1, 1, 1)
        m = torch.tensor(member_of_row).view(-1, 1, 1)
        h = torch.arange(kv_heads).view(1, -1, 1)
        j = torch.arange(query_group).view(1, 1, -1)
        # the groups' results come as [G, kv_heads, M, query_group] rows
        result_rows = (((g * kv_heads + h) * size + m) * query_group + j).view(-1)
        return cls(kv_rows=kv_rows, bias=bias,
                   members=torch.tensor([ms + ms[:1] * (size - len(ms)) for ms in groups], device=dev),
                   result_rows=result_rows.to(dev),
                   outside=None if all(in_group) else ~torch.tensor(in_group, device=dev).view(-1, 1, 1),
                   layer_kv=layer_kv)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     kv_rows: torch.Tensor, bias: torch.Tensor, scale: float,
                     shared: Optional[SharedPrefixes] = None, bags: Optional[torch.Tensor] = None,
                     layer: int = 0, sinks: Optional[torch.Tensor] = None) -> torch.Tensor:
    """One query per request. q: [B, heads, dim]; kv_rows: `decode_kv_rows` of the requests'
    page-table rows (padded with a zeroed page); bias: [B, 1, 1, n * page_size] `attention_bias`,
    0 where a position is in the context, -inf past its end; bags: `value_bags(kv_rows)` if the
    caller has them (they are the same for every layer of a step); layer: which of `shared`'s
    gathered prefixes are this cache's; sinks: [heads] float32 logits that join each head's
    softmax and weigh nothing (gpt-oss; not with `shared`).

    With `shared`, kv_rows covers only each row's positions after its group's prefix; the two
    parts are attended separately and merged by their softmax normalisers.
    """
    b, kv_heads, length = kv_rows.shape
    heads, dim = q.shape[1], q.shape[2]
    group = heads // kv_heads
    if bags is None:
        bags = value_bags(kv_rows, group)
    # Keys gathered head-major, so that each (request, KV head) has its keys contiguous: the
    # batched matmul below then runs ~6x faster than on a [B, length, kv_heads, dim] gather, and
    # the whole ~2x faster than CPU SDPA, whose one-row-per-head flash path is slow in bf16
    # (measured here). Values are never gathered (`_weighted_values`).
    k = _gather_rows(k_cache, kv_rows).view(b, kv_heads, length, dim)
    # the query heads that share a KV head are rows of one query
    qg = q.view(b, kv_heads, group, dim)
    if shared is None:
        p = _softmax(_scaled_scores(qg, k, bias, scale), None if sinks is None else sinks.view(1, kv_heads, group, 1))
        return _weighted_values(p, v_cache, bags).view(q.shape)
    assert sinks is None, "attention sinks with shared prefixes"

    # Both parts are scored in base 2 (scale * log2(e)) and weighted with exp2, which runs ~3x
    # faster than exp on the CPU here; softmax's own exp above is already fast.
    scale = scale * LOG2_E
    own = _unnormalised(_scaled_scores(qg, k, bias, scale), lambda p: _weighted_values(p, v_cache, bags))
    n_groups, members = shared.members.shape
    k_shared, v_shared = shared.gathered(layer, k_cache, v_cache)
    q_shared = (qg.index_select(0, shared.members.view(-1)).view(n_groups, members, kv_heads, group, dim)
                .transpose(1, 2).reshape(n_groups, kv_heads, members * group, dim))
    per_member = _unnormalised(_scaled_scores(q_shared, k_shared, shared.bias, scale),
                               lambda p: torch.matmul(p.to(v_shared.dtype), v_shared))
    # (out, max, sum) of the own part and of the shared one side by side: [2, B, kv_heads, group, dim + 2]
    both = torch.stack([own, per_member.view(-1, dim + 2).index_select(0, shared.result_rows).view(own.shape)])
    top = both[..., dim:dim + 1]
    if shared.outside is not None:
        top[1].masked_fill_(shared.outside.unsqueeze(-1), float("-inf"))
    merged = both.mul_(top.sub(top.amax(0)).exp2_()).sum(0)
    return (merged[..., :dim] / merged[..., dim + 1:]).to(q.dtype).view(q.shape)


def _scaled_scores(q: torch.Tensor, k: torch.Tensor, bias: torch.Tensor, scale: float) -> torch.Tensor:
    """float32 bias + scale * q k^T (one op after the matmul: add promotes bf16 scores itself)."""
    if not bias.is_floating_point():  # a bool mask would be added as 0 / 1
        raise TypeError("attention bias must be float (attention_bias of the mask), got " + str(bias.dtype))
    return torch.add(bias, torch.matmul(q, k.transpose(-1, -2)), alpha=scale)


def _softmax(scores: torch.Tensor, sink: Optional[torch.Tensor]) -> torch.Tensor:
    """Softmax over the last axis of scores; with `sink` (each row's sink logit, shaped to
    broadcast against scores[..., :1]), it joins the softmax as one more position whose weight
    is dropped."""
    if sink is None:
        return scores.softmax(-1)
    sink = sink.to(scores.dtype).expand(*scores.shape[:-1], 1)
    return torch.cat([scores, sink], dim=-1).softmax(-1)[..., :-1]


def _unnormalised(scores: torch.Tensor, weigh_values: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """[..., dim + 2] float32: weigh_values(p) with p = 2 ** (scores - max), then the max, then p's
    sum over the last axis, for base-2 scores (every row has a finite score). Overwrites `scores`."""
    top = scores.amax(-1, keepdim=True)
    p = scores.sub_(top).exp2_()
    return torch.cat([weigh_values(p).float(), top, p.sum(-1, keepdim=True)], dim=-1)


def _weighted_values(p: torch.Tensor, v_cache: torch.Tensor, bags: torch.Tensor) -> torch.Tensor:
    """p @ V for p [B, kv_heads, group, L] and V the cache rows `value_bags`, without gathering V:
    embedding_bag sums the weighted rows in place (~25% faster than gather + matmul at batch 32,
    measured here). Returns [B, kv_heads, group, dim] in the cache's dtype."""
    b, kv_heads, group, length = p.shape
    out = F.embedding_bag(bags, v_cache.reshape(-1, v_cache.shape[-1]), mode="sum",
                          per_sample_weights=p.reshape(-1, length).to(v_cache.dtype))
    return out.view(b, kv_heads, group, -1)


def _gather_rows(cache: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Rows of a cache viewed as [slots * kv_heads, dim]."""
    return cache.reshape(-1, cache.shape[-1]).index_select(0, rows.reshape(-1))


# Segments after a cached prefix are scored against their context with two matmuls per KV head:
# ~1.7x faster than CPU SDPA for the short segments of requests that hit the radix cache (SDPA's
# cost here grows with the context however few the queries; measured with 25 new tokens after 565
# cached), and segments after the same prefix are scored together, the prefix gathered once. The
# scores are materialised, so above this many of them SDPA runs instead.
MAX_SCORED_EXTEND = 1 << 22


@dataclass
class ExtendContext:
    """One scored call's index tensors (`extend_context`), built once a step."""
    rows: torch.Tensor   # [kv_heads, L] the context's rows of a cache viewed as [slots * kv_heads, dim]
    bias: torch.Tensor   # [n, 1, L] `attention_bias`: what each of the n new tokens sees


def extend_context(prefix_slots: torch.Tensor, new_slots: list[torch.Tensor], kv_heads: int,
                   heads: int) -> Optional[ExtendContext]:
    """Segments with new tokens at `new_slots` after the same cached prefix, scored as one call:
    each new token sees the prefix and its own segment up to itself. None where SDPA is better."""
    prefix_len, lens = prefix_slots.shape[0], [s.shape[0] for s in new_slots]
    n = sum(lens)
    length = prefix_len + n
    if prefix_len == 0 or n * heads * length > MAX_SCORED_EXTEND:
        return None
    dev = prefix_slots.device
    slots = torch.cat([prefix_slots, *new_slots])
    rows = slots.view(1, -1) * kv_heads + torch.arange(kv_heads, device=dev).view(-1, 1)
    # output_size given: otherwise the device's count is read back to size the result (a sync)
    segment = torch.repeat_interleave(torch.arange(len(lens), device=dev), torch.tensor(lens, device=dev),
                                      output_size=n)
    index = torch.cat([torch.arange(m, device=dev) for m in lens])    # position within its segment
    own = (segment.view(-1, 1) == segment.view(1, -1)) & (index.view(1, -1) <= index.view(-1, 1))
    visible = torch.cat([torch.ones(n, prefix_len, dtype=torch.bool, device=dev), own], dim=1)
    return ExtendContext(rows=rows, bias=attention_bias(visible.unsqueeze(1)))


def scored_extend_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            context: ExtendContext, scale: float) -> torch.Tensor:
    """New tokens q [n, heads, dim] (their K/V already written) over `context` -> [n, heads, dim]."""
    n, heads, dim = q.shape
    kv_heads, length = context.rows.shape
    group = heads // kv_heads
    k = _gather_rows(k_cache, context.rows).view(kv_heads, length, dim)
    v = _gather_rows(v_cache, context.rows).view(kv_heads, length, dim)
    qh = q.view(n, kv_heads, group, dim).transpose(0, 1).reshape(kv_heads, n * group, dim)
    scores = torch.matmul(qh, k.transpose(-1, -2)).view(kv_heads, n, group, length)
    p = torch.add(context.bias, scores, alpha=scale).softmax(-1).to(v.dtype).view(kv_heads, n * group, length)
    return torch.matmul(p, v).view(kv_heads, n, group, dim).transpose(0, 1).reshape(n, heads, dim)


def extend_attention(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
                     k_cache: torch.Tensor, v_cache: torch.Tensor,
                     context_slots: Optional[torch.Tensor], prefix_len: int, scale: float,
                     window: Optional[int] = None, sinks: Optional[torch.Tensor] = None) -> torch.Tensor:
    """New tokens of one request with SDPA: causal over themselves, full over the cached prefix
    (with `window`, each sees only the last `window` positions up to itself; with `sinks` [heads],
    each head's sink logit joins its softmax: scored here, SDPA takes none).

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
    if prefix_len == 0 and window is None and sinks is None:
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=n > 1, scale=scale, enable_gqa=gqa)
    else:
        rows = torch.arange(n, device=q.device).unsqueeze(1) + prefix_len
        columns = torch.arange(prefix_len + n, device=q.device).unsqueeze(0)
        mask = columns <= rows
        if window is not None:
            mask &= columns > rows - window
        if sinks is not None:
            return _scored_with_sinks(q, k, v, attention_bias(mask), scale, sinks)
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale, enable_gqa=gqa)
    return out.squeeze(0).transpose(0, 1)


def _scored_with_sinks(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, scale: float,
                       sinks: torch.Tensor) -> torch.Tensor:
    """q [n, heads, dim] over k / v [L, kv_heads, dim] with bias [n, L] and sink logits [heads]."""
    n, heads, dim = q.shape
    kv_heads = k.shape[1]
    qg = q.view(n, kv_heads, heads // kv_heads, dim).permute(1, 2, 0, 3)          # [kv, group, n, dim]
    scores = _scaled_scores(qg, k.transpose(0, 1).unsqueeze(1), bias, scale)     # [kv, group, n, L]
    p = _softmax(scores, sinks.view(kv_heads, -1, 1, 1)).to(v.dtype)
    out = torch.matmul(p, v.transpose(0, 1).unsqueeze(1))                       # [kv, group, n, dim]
    return out.permute(2, 0, 1, 3).reshape(n, heads, dim)
