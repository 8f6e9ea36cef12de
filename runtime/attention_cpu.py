"""The CPU attention backend: the host backend's torch extends with decodes and K/V writes in the
C++ kernels (kernels/cpu_kernels.py), which read each request's K/V straight from its pages (the
torch path gathers them into copies first, ~60% of a long-context decode step).

A decode's context is split into items (`DecodePlan`) so that one long request occupies every
thread; decodes whose contexts start on the same cached pages (one system prompt) have those
pages scored once for all of them. A pure-decode step's plan is also what the whole-layer kernel
reads (`paged_decode`, runtime/models/fused_decode.py). A model with sliding-window layers gets a
second plan for them, each decode's last `window` positions; attention sinks join each head's
softmax where the kernel merges a row's items.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from radixserve.kernels.cpu_kernels import CpuKernels, DecodePlan, PagedDecode
from radixserve.runtime.attention_torch import HostAttentionBackend, HostAttentionMetadata, shared_prefix_groups
from radixserve.runtime.forward_batch import DecodeSeq
from radixserve.runtime.kv_cache import KVCache


@dataclass
class KernelDecodeMetadata:
    paged: Optional[PagedDecode]            # every decode's whole context (None: window layers only)
    windowed: Optional[PagedDecode] = None  # the sliding-window layers': its last `window` positions


class KernelDecodes:
    def __init__(self, kv_cache: KVCache, page_table: torch.Tensor, num_heads: int, kernels: CpuKernels,
                 window: Optional[int] = None, window_only: bool = False):
        self.kv, self.table, self.heads, self.kernels, self.window = kv_cache, page_table, num_heads, kernels, window
        self.window_only = window_only   # every layer it serves is windowed: no whole-context plan
        self.page_size, self.head_dim = kv_cache.k.shape[2], kv_cache.k.shape[-1]
        self.scale = self.head_dim ** -0.5

    def prepare(self, decodes: list[DecodeSeq]) -> Optional[KernelDecodeMetadata]:
        if not decodes:
            return None
        rows, lens = [d.page_row for d in decodes], [d.context_len for d in decodes]
        plan = lambda g, w: PagedDecode.of(self.kv.k, self.kv.v, self.table,  # noqa: E731
                                           DecodePlan.of(rows, lens, g, self.heads, self.head_dim, w), self.scale)
        if self.window_only:
            return KernelDecodeMetadata(None, plan([], self.window))
        p = self.page_size
        # unlike the torch path's, sharing here costs no extra ops: every shared page counts
        groups = [(members, n * p) for members, n in shared_prefix_groups(decodes, p, min_group_saving=1,
                                                                             min_saving=1)]
        return KernelDecodeMetadata(plan(groups, None), None if self.window is None else plan([], self.window))

    def forward(self, layer: int, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                meta: KernelDecodeMetadata, window: Optional[int] = None,
                sinks: Optional[torch.Tensor] = None) -> torch.Tensor:
        assert window in (None, self.window), "one sliding window size per model"
        if q.stride(2) != 1 or q.stride(1) != q.shape[2]:
            q = q.contiguous()
        return self.kernels.decode_attention(q, meta.paged if window is None else meta.windowed, layer, sinks)


def paged_decode(meta: HostAttentionMetadata) -> Optional[PagedDecode]:
    """A step's decode plan as the whole-layer kernel reads it; None for a step with extends (the
    kernel takes no sliding-window layer: runtime/models/llama.py's `fusable`)."""
    return meta.decodes.paged if meta.num_decode and not (meta.sdpa_extends or meta.scored_extends) else None


def cpu_attention_backend(kv_cache: KVCache, page_table: torch.Tensor, num_heads: int, kernels: CpuKernels,
                          window: Optional[int] = None, sinks: bool = False,
                          window_only: bool = False) -> HostAttentionBackend:
    """`window`: the sliding window of the model's windowed layers, if any; `sinks`: its layers have
    attention sinks. Either turns off the torch extends' shared prefixes, whose call takes neither.
    `window_only`: every layer it serves is windowed (the window pool's backend)."""
    return HostAttentionBackend(kv_cache, page_table, num_heads,
                                KernelDecodes(kv_cache, page_table, num_heads, kernels, window, window_only),
                                write=kernels.write_kv, paged_decode=paged_decode, window=window,
                                share=window is None and not sinks)
