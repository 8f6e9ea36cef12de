"""CUDA graphs for decode steps: one graph per batch size of a ladder, replayed for a batch padded
up to the next size. A decode step of a small model is dominated by kernel launch overhead
(hundreds of launches per step); a replay issues them all at once. Prefill stays eager.

Only pure-decode steps are replayed; padding rows decode a dummy token whose K/V go to the
padding page and whose logits are dropped. With `capture=False` the same padded static batches
run eagerly: how tests exercise everything but the capture itself on a machine without CUDA.
"""
from __future__ import annotations

from bisect import bisect_left
from typing import Optional

import numpy as np
import torch

from radixserve.runtime.forward_batch import BatchLayout, ForwardBatch
from radixserve.runtime.platform import Platform

# static input rows: token id, position, output slot, page-table row, context length
_IDS, _POS, _SLOT, _ROW, _LEN = range(5)


def capture_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 16 below max_batch, then max_batch: padding wastes at
    most 15 rows (cheap next to the weights every row of a decode step reads anyway)."""
    small = [s for s in (1, 2, 4, 8) if s < max_batch]
    return sorted(set(small + list(range(16, max_batch, 16)) + [max_batch]))


def padded_size(n: int, sizes: list[int]) -> Optional[int]:
    """The smallest captured size >= n, or None when n is beyond the ladder."""
    i = bisect_left(sizes, n)
    return sizes[i] if i < len(sizes) else None


class DecodeGraphRunner:
    """Owns the static decode inputs, one captured graph (and its logits) per ladder size."""

    def __init__(self, model, attention, hooks, max_batch: int, max_context_len: int, pad_slot: int,
                 platform: Platform, capture: bool = True):
        """`hooks`: the attention backend's GraphHooks (runtime/attention.py)."""
        self.model, self.attention, self.hooks = model, attention, hooks
        self.sizes = capture_sizes(max_batch)
        self.platform, self.device = platform, platform.device
        self.static = torch.zeros(5, self.sizes[-1], dtype=torch.long, device=self.device)
        # what a padding row holds: token 0 at position 0, written to the padding page, length 1
        self.pad_column = np.array([0, 0, pad_slot, 0, 1], dtype=np.int64)
        self.static[:, :] = torch.from_numpy(self.pad_column).to(self.device).unsqueeze(1)
        # the step's inputs cross in one copy of the whole (contiguous) buffer, pinned on CUDA
        self.host = platform.staging(torch.zeros(5, self.sizes[-1], dtype=torch.long,
                                                 pin_memory=platform.pin_host_buffers))
        # max_context_len fixes each size's split count, so one graph serves every context length
        self.batches = {bs: self._batch(bs, max_context_len) for bs in self.sizes}
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        if capture:
            self._capture_all()

    def _batch(self, bs: int, max_context_len: int) -> ForwardBatch:
        s = self.static[:, :bs]
        return ForwardBatch(input_ids=s[_IDS], positions=s[_POS], out_slots=s[_SLOT], sample_rows=None,
                            attention=self.hooks.decode_metadata(s[_ROW], s[_LEN], max_context_len))

    def _capture_all(self) -> None:
        pool = None
        # Warm-up runs on a side stream, as PyTorch documents for capture: Triton compiles and the
        # allocator's first blocks are made outside the capture, and off the stream it records.
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for bs in self.sizes:
                self.model.forward(self.batches[bs], self.attention)
        torch.cuda.current_stream(self.device).wait_stream(side)
        torch.cuda.synchronize(self.device)
        # largest first: the smaller graphs then fit in the memory pool the largest one made
        for bs in reversed(self.sizes):
            graph = torch.cuda.CUDAGraph()
            # thread_local: an allocation by another thread (a request's grammar compile, the
            # server) during the capture is not an error that aborts it
            with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                self.outputs[bs] = self.model.forward(self.batches[bs], self.attention)
            pool = graph.pool()
            self.graphs[bs] = graph
        torch.cuda.synchronize(self.device)
        self.hooks.after_capture()

    def run(self, layout: BatchLayout) -> Optional[torch.Tensor]:
        """Logits of a decode-only layout ([n, vocab], valid until the next run), or None when n is
        beyond the ladder."""
        n = len(layout.ids)
        bs = padded_size(n, self.sizes)
        if bs is None or n == 0:
            return None
        host = self.host.writable().numpy()
        for row, values in ((_IDS, layout.ids), (_POS, layout.positions), (_SLOT, layout.out_slots),
                            (_ROW, [d.page_row for d in layout.decodes]), (_LEN, [d.context_len for d in layout.decodes])):
            host[row, :n] = values
        host[:, n:bs] = self.pad_column[:, None]
        self.host.upload(out=self.static)   # one asynchronous copy; columns past bs are never read
        if bs in self.graphs:
            self.graphs[bs].replay()
            logits = self.outputs[bs][:n]
        else:
            logits = self.model.forward(self.batches[bs], self.attention)[:n]
        if len(layout.sample_rows) < n:   # rows of a forced run: only each request's last is sampled
            logits = logits[self.platform.upload(layout.sample_rows, torch.long)]
        return logits
