"""Turns a scheduled batch into one ragged forward pass and returns the logits to sample from.

The runner lays the step out on the host (`BatchLayout`), uploads the page-table rows written
since the last step, lets the attention backend build its metadata from that layout, and runs the
model; it knows nothing of any backend's kernels. What a backend can do beyond that (CUDA graphs,
the CPU's whole-layer decode) is read once, here, when the runner is built.
"""
from __future__ import annotations

import torch

from radixserve.radix import RequestPageTable
from radixserve.runtime.attention import AttentionBackend
from radixserve.runtime.cuda_graph import DecodeGraphRunner
from radixserve.runtime.forward_batch import BatchLayout, ForwardBatch
from radixserve.runtime.platform import Platform
from radixserve.runtime.scheduler import ScheduledBatch


class ModelRunner:
    def __init__(self, model, attention: AttentionBackend, table: RequestPageTable, page_size: int, pad_page: int,
                 platform: Platform):
        self.model = model
        self.attention = attention
        self.table = table
        self.page_size = page_size
        self.pad_page = pad_page
        self.platform = platform
        self.graphs: DecodeGraphRunner | None = None
        # the whole-layer decode needs both a model with the fused form and a backend that plans for it
        self._paged_decode = attention.paged_decode if model.fused_decode is not None else None

    def use_decode_graphs(self, max_batch: int, max_context_len: int, capture: bool = True) -> bool:
        """Replay pure-decode steps from CUDA graphs where the platform and the backend offer them
        (capture=False: the same padded static batches, run eagerly; for tests without CUDA)."""
        hooks = self.attention.graphs
        if hooks is None or (capture and not self.platform.decode_graphs):
            return False
        self.graphs = DecodeGraphRunner(self.model, self.attention, hooks, max_batch, max_context_len,
                                        self.pad_page * self.page_size, self.platform, capture=capture)
        return True

    def warm_up(self) -> None:
        """One dummy step that launches every attention kernel once (a decode and a one-token
        extend at position 0 of page-table row 0, written to the padding page; logits dropped).
        The caller zeroes the padding page after it."""
        layout = BatchLayout(self.page_size)
        layout.add_decode(0, 0, 0, [self.pad_page])
        layout.add_extend([0], 0, 1, 0, [self.pad_page], samples=True)
        meta = self.attention.prepare(layout)
        self.model.forward(ForwardBatch.of(layout, meta, self.platform), self.attention)

    def layout(self, batch: ScheduledBatch) -> BatchLayout:
        """The flat token rows of a step: decodes first, then each extend segment."""
        layout = BatchLayout(self.page_size)
        for item in batch.decodes:
            r = item.req
            for pos in range(r.kv_len, r.kv_len + item.num_tokens):
                layout.add_decode(r.token_ids[pos], pos, r.page_row, r.pages, samples=pos == r.num_tokens - 1)
        for item in batch.extends:
            r = item.req
            layout.add_extend(r.token_ids, r.kv_len, item.num_tokens, r.page_row, r.pages, item.samples)
        return layout

    def forward(self, batch: ScheduledBatch) -> torch.Tensor:
        """Logits [rows that sample, vocab], in the order of `batch.items` (each decode samples)."""
        self.table.upload(self.platform.upload)
        layout = self.layout(batch)
        if self.graphs is not None and not layout.extends:
            logits = self.graphs.run(layout)
            if logits is not None:
                return logits
        meta = self.attention.prepare(layout)
        paged = self._paged_decode(meta) if self._paged_decode is not None else None
        return self.model.forward(ForwardBatch.of(layout, meta, self.platform, paged), self.attention)
