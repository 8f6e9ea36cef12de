"""The CPU attention backend: decodes and K/V writes in the C++ kernels (kernels/cpu_kernels.py),
which read each request's K/V straight from its pages (the torch path gathers them into copies
first, ~60% of a long-context decode step); extends as the torch backend does them.

A decode's context is split into items (`DecodePlan`) so that one long request occupies every
thread; decodes whose contexts start on the same cached pages (one system prompt) have those
pages scored once for all of them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from radixserve.kernels.cpu_kernels import CpuKernels, DecodePlan, PagedDecode
from radixserve.runtime.attention_torch import TorchAttentionBackend, TorchAttentionMetadata, shared_prefix_groups
from radixserve.runtime.forward_batch import DecodeSeq, ForwardBatch
from radixserve.runtime.kv_cache import KVCache


@dataclass
class CpuAttentionMetadata(TorchAttentionMetadata):
    decode_plan: Optional[DecodePlan] = None
    paged_decode: Optional[PagedDecode] = None   # the plan as the kernels read it


class CpuAttentionBackend(TorchAttentionBackend):
    metadata_type = CpuAttentionMetadata

    def __init__(self, kv_cache: KVCache, page_table: torch.Tensor, num_heads: int, kernels: CpuKernels):
        super().__init__(kv_cache, page_table, num_heads)
        self.kernels = kernels
        self.head_dim = kv_cache.k.shape[-1]

    def _prepare_decodes(self, decodes: list[DecodeSeq], meta: CpuAttentionMetadata) -> None:
        p = self.page_size
        # unlike the torch path's, sharing here costs no extra ops: every shared page counts
        groups = [(members, n * p) for members, n in shared_prefix_groups(decodes, p, min_group_saving=1,
                                                                             min_saving=1)]
        meta.decode_plan = DecodePlan.of([d.page_row for d in decodes], [d.context_len for d in decodes], groups,
                                         self.heads, self.head_dim)
        meta.paged_decode = PagedDecode.of(self.kv.k, self.kv.v, self.table, meta.decode_plan, self.scale)

    def paged_decode(self, batch: ForwardBatch) -> Optional[PagedDecode]:
        meta: CpuAttentionMetadata = batch.attention
        return meta.paged_decode if meta.num_decode == batch.num_tokens else None

    def _write_kv(self, k_cache, v_cache, slots, k, v) -> None:
        self.kernels.write_kv(k_cache, v_cache, slots, k, v)

    def _decode(self, layer, q, k_cache, v_cache, meta) -> torch.Tensor:
        if q.stride(2) != 1 or q.stride(1) != q.shape[2]:
            q = q.contiguous()
        return self.kernels.decode_attention(q, meta.paged_decode, layer)
