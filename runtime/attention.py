"""Attention backends: the model calls `backend.forward(layer, q, k, v, batch)` and never knows which runs."""
from __future__ import annotations

from typing import Protocol

import torch

from kernels.paged_attention import decode_attention, extend_attention, write_kv
from runtime.forward_batch import ForwardBatch
from runtime.kv_cache import KVCache


class AttentionBackend(Protocol):
    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                batch: ForwardBatch) -> torch.Tensor:
        """q: [T, heads, dim], k/v: [T, kv_heads, dim] -> [T, heads, dim]; stores k/v in the cache."""
        ...


class TorchAttentionBackend:
    """Plain-torch paged attention (the CPU path): one batched call for decodes, one per extend segment."""

    def __init__(self, kv_cache: KVCache, head_dim: int):
        self.kv = kv_cache
        self.scale = head_dim ** -0.5

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                batch: ForwardBatch) -> torch.Tensor:
        k_cache, v_cache = self.kv.k[layer], self.kv.v[layer]
        write_kv(k_cache, v_cache, batch.out_slots, k, v)
        nd = batch.num_decode
        if nd == q.shape[0]:
            return decode_attention(q, k_cache, v_cache, batch.decode_pages, batch.decode_mask, self.scale)
        out = torch.empty_like(q)
        if nd:
            out[:nd] = decode_attention(q[:nd], k_cache, v_cache, batch.decode_pages, batch.decode_mask, self.scale)
        for seg in batch.extends:
            rows = slice(seg.start, seg.start + seg.length)
            out[rows] = extend_attention(q[rows], k[rows], v[rows], k_cache, v_cache,
                                         seg.context_slots, seg.prefix_len, self.scale)
        return out


def make_attention_backend(name: str, kv_cache: KVCache, head_dim: int) -> AttentionBackend:
    if name in ("auto", "torch"):
        return TorchAttentionBackend(kv_cache, head_dim)
    raise ValueError(f"unknown attention backend {name!r}")
