"""Attention backends: the model calls `backend.forward(layer, q, k, v, batch)` and never knows which runs."""
from __future__ import annotations

import os
from typing import Protocol

import torch

from radixserve.kernels import triton_attention as ta
from radixserve.kernels.paged_attention import decode_attention, extend_attention, scored_extend_attention, write_kv
from radixserve.runtime.config import ATTENTION_BACKENDS
from radixserve.runtime.forward_batch import ForwardBatch
from radixserve.runtime.kv_cache import KVCache


class AttentionBackend(Protocol):
    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                batch: ForwardBatch) -> torch.Tensor:
        """q: [T, heads, dim], k/v: [T, kv_heads, dim] -> [T, heads, dim]; stores k/v in the cache."""
        ...


class TorchAttentionBackend:
    """Plain-torch paged attention (the CPU path): one batched call for decodes, one per group of extend
    segments after the same cached prefix, one per other segment."""

    def __init__(self, kv_cache: KVCache, head_dim: int):
        self.kv = kv_cache
        self.scale = head_dim ** -0.5

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                batch: ForwardBatch) -> torch.Tensor:
        k_cache, v_cache = self.kv.k[layer], self.kv.v[layer]
        write_kv(k_cache, v_cache, batch.out_slots, k, v)
        nd = batch.num_decode
        if nd == q.shape[0]:
            return self._decode(layer, q, k_cache, v_cache, batch)
        out = torch.empty_like(q)
        if nd:
            out[:nd] = self._decode(layer, q[:nd], k_cache, v_cache, batch)
        for scored in batch.scored_extends:
            out.index_copy_(0, scored.rows, scored_extend_attention(q.index_select(0, scored.rows), k_cache,
                                                                    v_cache, scored.context, self.scale))
        for seg in batch.extends:
            if seg.scored:
                continue
            rows = slice(seg.start, seg.start + seg.length)
            out[rows] = extend_attention(q[rows], k[rows], v[rows], k_cache, v_cache,
                                         seg.context_slots, seg.prefix_len, self.scale)
        return out

    def _decode(self, layer: int, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                batch: ForwardBatch) -> torch.Tensor:
        return decode_attention(q, k_cache, v_cache, batch.decode_kv_rows, batch.decode_bias, self.scale,
                                batch.decode_shared, batch.decode_value_bags, layer)


class TritonAttentionBackend:
    """Triton kernels (the CUDA path): one launch each for the KV write, the decode rows (split-KV,
    plus its reduction) and all extend segments. Reads the kernel metadata of ForwardBatch and
    never syncs with the host, so decode steps can be captured in CUDA graphs.

    CPU tensors are accepted only under TRITON_INTERPRET=1 (how tests run these kernels)."""

    needs_kernel_metadata = True

    def __init__(self, kv_cache: KVCache, head_dim: int):
        if ta.triton is None:
            raise ValueError("attention-backend triton: triton is not installed")
        device = kv_cache.k.device
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError("attention-backend triton needs a CUDA device")
        self.kv = kv_cache
        self.scale = head_dim ** -0.5
        self.kv_heads = kv_cache.k.shape[3]
        self.num_sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                batch: ForwardBatch) -> torch.Tensor:
        k_cache, v_cache = self.kv.k[layer], self.kv.v[layer]
        ta.write_kv_triton(k_cache, v_cache, batch.out_slots, k, v)
        out = torch.empty_like(q)
        nd = batch.num_decode
        if nd:
            splits = ta.num_decode_splits(nd, self.kv_heads, batch.decode_max_len, self.num_sms)
            ta.decode_attention_triton(q[:nd], k_cache, v_cache, batch.page_table, batch.decode_rows,
                                       batch.decode_lens, self.scale, splits, out=out[:nd])
        if batch.extend_meta is not None:
            ta.extend_attention_triton(q, k_cache, v_cache, batch.page_table, batch.extend_meta,
                                       batch.extend_max_len, self.scale, out)
        return out


def resolve_attention_backend(name: str, device: torch.device) -> str:
    """`auto`: Triton on CUDA (when installed), torch elsewhere."""
    if name == "auto":
        return "triton" if device.type == "cuda" and ta.triton is not None else "torch"
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}")
    return name


def make_attention_backend(name: str, kv_cache: KVCache, head_dim: int) -> AttentionBackend:
    if resolve_attention_backend(name, kv_cache.k.device) == "triton":
        return TritonAttentionBackend(kv_cache, head_dim)
    return TorchAttentionBackend(kv_cache, head_dim)
