"""The CPU attention backend: the host backend's torch extends with decodes and K/V writes in the
C++ kernels (kernels/cpu_kernels.py), which read each request's K/V straight from its pages (the
torch path gathers them into copies first, ~60% of a long-context decode step).

A decode's context is split into items (`DecodePlan`) so that one long request occupies every
thread; decodes whose contexts start on the same cached pages (one system prompt) have those
pages scored once for all of them. A pure-decode step's plan is also what the whole-layer kernel
reads (`paged_decode`, runtime/models/fused_decode.py).
"""
from __future__ import annotations

from typing import Optional

import torch

from radixserve.kernels.cpu_kernels import CpuKernels, DecodePlan, PagedDecode
from radixserve.runtime.attention_torch import HostAttentionBackend, HostAttentionMetadata, shared_prefix_groups
from radixserve.runtime.forward_batch import DecodeSeq
from radixserve.runtime.kv_cache import KVCache


class KernelDecodes:
    def __init__(self, kv_cache: KVCache, page_table: torch.Tensor, num_heads: int, kernels: CpuKernels):
        self.kv, self.table, self.heads, self.kernels = kv_cache, page_table, num_heads, kernels
        self.page_size, self.head_dim = kv_cache.k.shape[2], kv_cache.k.shape[-1]
        self.scale = self.head_dim ** -0.5

    def prepare(self, decodes: list[DecodeSeq]) -> Optional[PagedDecode]:
        if not decodes:
            return None
        p = self.page_size
        # unlike the torch path's, sharing here costs no extra ops: every shared page counts
        groups = [(members, n * p) for members, n in shared_prefix_groups(decodes, p, min_group_saving=1,
                                                                             min_saving=1)]
        plan = DecodePlan.of([d.page_row for d in decodes], [d.context_len for d in decodes], groups,
                             self.heads, self.head_dim)
        return PagedDecode.of(self.kv.k, self.kv.v, self.table, plan, self.scale)

    def forward(self, layer: int, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                meta: PagedDecode, window: Optional[int] = None, sinks: Optional[torch.Tensor] = None) -> torch.Tensor:
        assert window is None and sinks is None, "the C++ decode kernels take neither (runtime/attention.py)"
        if q.stride(2) != 1 or q.stride(1) != q.shape[2]:
            q = q.contiguous()
        return self.kernels.decode_attention(q, meta, layer)


def paged_decode(meta: HostAttentionMetadata) -> Optional[PagedDecode]:
    """A step's decode plan as the whole-layer kernel reads it; None for a step with extends."""
    return meta.decodes if meta.num_decode and not (meta.sdpa_extends or meta.scored_extends) else None


def cpu_attention_backend(kv_cache: KVCache, page_table: torch.Tensor, num_heads: int,
                          kernels: CpuKernels) -> HostAttentionBackend:
    return HostAttentionBackend(kv_cache, page_table, num_heads,
                                KernelDecodes(kv_cache, page_table, num_heads, kernels),
                                write=kernels.write_kv, paged_decode=paged_decode)
