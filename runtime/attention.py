"""Attention backends: each builds the metadata its kernels need from a backend-neutral
`BatchLayout` (`prepare`), and the model calls `forward(layer, q, k, v, batch)` with the batch
that carries it, never knowing which backend runs. What only some backends offer is a capability
attribute, None elsewhere, read once when the runner is built: `graphs` (CUDA-graph capture and
replay, the Triton backend) and `paged_decode` (the whole-layer CPU kernels' view of a step)."""
from __future__ import annotations

from typing import Any, Callable, Optional, Protocol

import torch

from radixserve.radix import WindowPages
from radixserve.runtime.attention_cpu import cpu_attention_backend
from radixserve.runtime.attention_split import SplitAttention
from radixserve.runtime.attention_torch import torch_attention_backend
from radixserve.runtime.attention_triton import TritonAttentionBackend
from radixserve.runtime.config import ATTENTION_BACKENDS
from radixserve.runtime.forward_batch import BatchLayout, ForwardBatch
from radixserve.runtime.kv_cache import KVCache, KVLayers
from radixserve.runtime.models.layer_ops import KERNEL_DTYPES
from radixserve.runtime.platform import Platform


class GraphHooks(Protocol):
    def decode_metadata(self, rows: torch.Tensor, lens: torch.Tensor, max_len: int) -> Any:
        """Metadata of a decode-only step on static tensors (a graph's inputs)."""
        ...

    def after_capture(self) -> None:
        """Undo what capturing wrote (e.g. dummy K/V in the padding page)."""
        ...


class AttentionBackend(Protocol):
    graphs: Optional[GraphHooks]
    paged_decode: Optional[Callable[[Any], Any]]   # this step's metadata -> kernels' PagedDecode, or None

    def prepare(self, layout: BatchLayout) -> Any:
        """This step's metadata (index tensors on the device), opaque to everyone else."""
        ...

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                batch: ForwardBatch, window: Optional[int] = None, sinks: Optional[torch.Tensor] = None) -> torch.Tensor:
        """q: [T, heads, dim], k/v: [T, kv_heads, dim] -> [T, heads, dim]; stores k/v in the cache.
        `window`: this layer sees only the last `window` positions (sliding-window layers);
        `sinks`: [heads] logits that join each head's softmax (gpt-oss)."""
        ...


def resolve_attention_backend(name: str, platform: Platform, window: Optional[int] = None,
                              sinks: bool = False) -> str:
    """`auto`: the platform decides (Triton on CUDA when installed, the C++ kernels on the CPU
    where they build, torch elsewhere). Every backend takes sliding windows and attention sinks."""
    if name == "auto":
        return platform.default_attention_backend()
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}")
    return name


def make_attention_backend(name: str, kv_cache: KVCache, page_table: torch.Tensor, num_heads: int,
                           platform: Platform, window: Optional[int] = None, sinks: bool = False,
                           window_only: bool = False) -> AttentionBackend:
    """`window_only`: every layer the backend serves is windowed (a window pool's backend)."""
    resolved = resolve_attention_backend(name, platform, window, sinks)
    if resolved == "triton":
        return TritonAttentionBackend(kv_cache, page_table, num_heads, platform)
    if resolved == "cpu":
        kernels = platform.kernels()
        if kernels is not None and kv_cache.k.dtype in KERNEL_DTYPES:
            return cpu_attention_backend(kv_cache, page_table, num_heads, kernels, window, sinks, window_only)
        if name != "auto":
            raise ValueError("attention backend cpu needs the CPU kernels (a C++ compiler) and a float32 or "
                             "bfloat16 KV cache on the CPU")
    return torch_attention_backend(kv_cache, page_table, num_heads, window, sinks, window_only)


def make_split_attention(name: str, kv: KVLayers, page_table: torch.Tensor, windows: WindowPages,
                         num_heads: int, platform: Platform, window: int, sinks: bool = False) -> SplitAttention:
    """A model whose sliding-window layers keep their K/V in their own pool: one backend each."""
    window_table = torch.full_like(page_table, windows.num_pages)   # the window pool's padding page
    return SplitAttention(make_attention_backend(name, kv.full, page_table, num_heads, platform, None, sinks),
                          make_attention_backend(name, kv.windowed, window_table, num_heads, platform, window,
                                                 sinks, window_only=True),
                          kv.groups, windows, page_table, window_table, platform)
