"""Attention backends: each builds the metadata its kernels need from a backend-neutral
`BatchLayout` (`prepare`), and the model calls `forward(layer, q, k, v, batch)` with the batch
that carries it, never knowing which backend runs."""
from __future__ import annotations

from typing import Any, Protocol

import torch

from radixserve.runtime.attention_torch import TorchAttentionBackend
from radixserve.runtime.attention_triton import TritonAttentionBackend
from radixserve.runtime.config import ATTENTION_BACKENDS
from radixserve.runtime.forward_batch import BatchLayout, ForwardBatch
from radixserve.runtime.kv_cache import KVCache
from radixserve.runtime.platform import get_platform


class AttentionBackend(Protocol):
    supports_decode_graphs: bool   # offers `decode_metadata` on static tensors, for CUDA graphs

    def prepare(self, layout: BatchLayout) -> Any:
        """This step's metadata (index tensors on the device), opaque to everyone else."""
        ...

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                batch: ForwardBatch) -> torch.Tensor:
        """q: [T, heads, dim], k/v: [T, kv_heads, dim] -> [T, heads, dim]; stores k/v in the cache."""
        ...


def resolve_attention_backend(name: str, device: torch.device) -> str:
    """`auto`: the device's platform decides (Triton on CUDA when installed, torch elsewhere)."""
    if name == "auto":
        return get_platform(device).default_attention_backend()
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}")
    return name


def make_attention_backend(name: str, kv_cache: KVCache, page_table: torch.Tensor, num_heads: int) -> AttentionBackend:
    if resolve_attention_backend(name, kv_cache.k.device) == "triton":
        return TritonAttentionBackend(kv_cache, page_table, num_heads)
    return TorchAttentionBackend(kv_cache, page_table, num_heads)
