"""Turns a scheduled batch into one ragged forward pass and returns the logits to sample from.

The runner lays the step out on the host (`BatchLayout`), lets the attention backend build its
metadata from that layout, and runs the model; it knows nothing of any backend's kernels.
"""
from __future__ import annotations

import torch

from radixserve.runtime.attention import AttentionBackend
from radixserve.runtime.cuda_graph import DecodeGraphRunner
from radixserve.runtime.forward_batch import BatchLayout, ForwardBatch
from radixserve.runtime.scheduler import ScheduledBatch


class ModelRunner:
    def __init__(self, model, attention: AttentionBackend, page_size: int, pad_page: int, device: torch.device):
        self.model = model
        self.attention = attention
        self.page_size = page_size
        self.pad_page = pad_page
        self.device = device
        self.graphs: DecodeGraphRunner | None = None

    def enable_decode_graphs(self, max_batch: int, max_context_len: int, capture: bool = True) -> None:
        """Replay pure-decode steps from CUDA graphs (capture=False: the same padded static batches,
        run eagerly; for tests without CUDA)."""
        if not self.attention.supports_decode_graphs:
            raise ValueError("decode graphs need an attention backend that supports them (triton)")
        self.graphs = DecodeGraphRunner(self.model, self.attention, max_batch, max_context_len,
                                        self.pad_page * self.page_size, self.device, capture=capture)

    def layout(self, batch: ScheduledBatch) -> BatchLayout:
        """The flat token rows of a step: decodes first, then each extend segment."""
        layout = BatchLayout(self.page_size)
        for item in batch.decodes:
            r = item.req
            layout.add_decode(r.token_ids[r.kv_len], r.kv_len, r.page_row, r.pages)
        for item in batch.extends:
            r = item.req
            layout.add_extend(r.token_ids, r.kv_len, item.num_tokens, r.page_row, r.pages, item.samples)
        return layout

    def forward(self, batch: ScheduledBatch) -> torch.Tensor:
        """Logits [rows that sample, vocab], in the order of `batch.items` that sample."""
        layout = self.layout(batch)
        if self.graphs is not None and not layout.extends:
            logits = self.graphs.run(layout)
            if logits is not None:
                return logits
        fb = ForwardBatch.of(layout, self.attention.prepare(layout), self.device)
        return self.model.forward(fb, self.attention)
