"""The Triton attention backend (the CUDA path): one launch each for the KV write, the decode rows
(split-KV, plus its reduction) and all extend segments. Its kernels read the request page table
themselves; the metadata it builds never syncs with the host, so decode steps can be captured in
CUDA graphs.

CPU tensors are accepted only under TRITON_INTERPRET=1 (how tests run these kernels)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import torch

from radixserve.kernels import triton_attention as ta
from radixserve.runtime.forward_batch import BatchLayout, ForwardBatch
from radixserve.runtime.kv_cache import KVCache
from radixserve.runtime.platform import Platform


@dataclass
class TritonAttentionMetadata:
    num_decode: int
    decode_rows: Optional[torch.Tensor] = None   # [num_decode] page-table row of each decode
    decode_lens: Optional[torch.Tensor] = None   # [num_decode] context length, the new token included
    decode_max_len: int = 0                      # host-side bound on decode_lens (sizes the split count)
    extend_meta: Optional[torch.Tensor] = None   # int64 [4, segments]: start row, length, prefix_len, page row
    extend_max_len: int = 0                      # longest segment (sizes the extend grid)


class TritonGraphHooks:
    """What CUDA-graph capture and replay need of this backend (runtime/cuda_graph.py)."""

    def __init__(self, backend: "TritonAttentionBackend"):
        self.backend = backend

    def decode_metadata(self, rows: torch.Tensor, lens: torch.Tensor, max_len: int) -> TritonAttentionMetadata:
        """Metadata of decodes only, on the caller's static tensors."""
        return TritonAttentionMetadata(rows.shape[0], decode_rows=rows, decode_lens=lens, decode_max_len=max_len)

    def after_capture(self) -> None:
        """Capture wrote dummy K/V into the padding page (replays keep doing so for padding rows; the
        kernels never read it): zeroed, as the KV cache promises, once capture is over."""
        self.backend.kv.clear_pad_page()


class TritonAttentionBackend:
    paged_decode = None   # the CPU kernels' whole-layer path only

    def __init__(self, kv_cache: KVCache, page_table: torch.Tensor, num_heads: int, platform: Platform):
        if ta.triton is None:
            raise ValueError("attention-backend triton: triton is not installed")
        device = kv_cache.k.device
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError("attention-backend triton needs a CUDA device")
        self.kv = kv_cache
        self.table = page_table
        self.device = page_table.device
        self.kv_heads, head_dim = kv_cache.k.shape[3], kv_cache.k.shape[4]
        self.scale = head_dim ** -0.5
        self.num_sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
        self.platform = platform
        self.graphs = TritonGraphHooks(self)

    def prepare(self, layout: BatchLayout) -> TritonAttentionMetadata:
        """Every index tensor is a view of one int64 buffer: one host-to-device copy a step."""
        nd, ne = layout.num_decode, len(layout.extends)
        dec_lens = [d.context_len for d in layout.decodes]
        columns = [[s.start for s in layout.extends], [s.length for s in layout.extends],
                   [s.prefix_len for s in layout.extends], [s.page_row for s in layout.extends]]
        flat = self.platform.upload([d.page_row for d in layout.decodes] + dec_lens + sum(columns, []), torch.long)
        rows, lens, extend = flat.split([nd, nd, 4 * ne])
        meta = self.graphs.decode_metadata(rows, lens, max(dec_lens, default=0)) if nd else TritonAttentionMetadata(0)
        if ne:
            meta.extend_meta, meta.extend_max_len = extend.view(4, ne), max(columns[1])
        return meta

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                batch: ForwardBatch, window: Optional[int] = None, sinks: Optional[torch.Tensor] = None) -> torch.Tensor:
        meta: TritonAttentionMetadata = batch.attention
        k_cache, v_cache = self.kv.k[layer], self.kv.v[layer]
        ta.write_kv_triton(k_cache, v_cache, batch.out_slots, k, v)
        out = torch.empty_like(q)
        nd = meta.num_decode
        if nd:
            splits = ta.num_decode_splits(nd, self.kv_heads, meta.decode_max_len, self.num_sms)
            ta.decode_attention_triton(q[:nd], k_cache, v_cache, self.table, meta.decode_rows,
                                       meta.decode_lens, self.scale, splits, out=out[:nd], window=window, sinks=sinks)
        if meta.extend_meta is not None:
            ta.extend_attention_triton(q, k_cache, v_cache, self.table, meta.extend_meta,
                                       meta.extend_max_len, self.scale, out, window=window, sinks=sinks)
        return out
