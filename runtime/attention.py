"""Attention backends: each builds the metadata its kernels need from a backend-neutral
`BatchLayout` (`prepare`), and the model calls `forward(layer, q, k, v, batch)` with the batch
that carries it, never knowing which backend runs."""
from __future__ import annotations

from typing import Any, Protocol

import torch

from radixserve.runtime.attention_cpu import CpuAttentionBackend
from radixserve.runtime.attention_torch import TorchAttentionBackend
from radixserve.runtime.attention_triton import TritonAttentionBackend
from radixserve.runtime.config import ATTENTION_BACKENDS
from radixserve.runtime.forward_batch import BatchLayout, ForwardBatch
from radixserve.runtime.kv_cache import KVCache
from radixserve.runtime.models.layer_ops import KERNEL_DTYPES
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

    def paged_decode(self, batch: ForwardBatch) -> Any:
        """A pure-decode step's attention as the CPU kernels' whole-layer call reads it
        (kernels/cpu_kernels.py's PagedDecode); None where this backend or step has none."""
        ...


def resolve_attention_backend(name: str, device: torch.device) -> str:
    """`auto`: the device's platform decides (Triton on CUDA when installed, the C++ kernels on the
    CPU where they build, torch elsewhere)."""
    if name == "auto":
        return get_platform(device).default_attention_backend()
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}")
    return name


def make_attention_backend(name: str, kv_cache: KVCache, page_table: torch.Tensor, num_heads: int) -> AttentionBackend:
    device = kv_cache.k.device
    resolved = resolve_attention_backend(name, device)
    if resolved == "triton":
        return TritonAttentionBackend(kv_cache, page_table, num_heads)
    if resolved == "cpu":
        kernels = get_platform(device).kernels() if device.type == "cpu" else None
        if kernels is not None and kv_cache.k.dtype in KERNEL_DTYPES:
            return CpuAttentionBackend(kv_cache, page_table, num_heads, kernels)
        if name != "auto":
            raise ValueError("attention backend cpu needs the CPU kernels (a C++ compiler) and a float32 or "
                             "bfloat16 KV cache on the CPU")
    return TorchAttentionBackend(kv_cache, page_table, num_heads)
