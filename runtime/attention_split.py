"""Attention for a model whose sliding-window layers keep their K/V in their own pool
(runtime/kv_cache.py's `KVLayers`): two backends of one kind, one over the global layers' cache and
the request page table, one over the window pool and a page table of window pages, and each layer
sent to its own. The window page table is the request page table read through the window map
(radix/window_pages.py), rebuilt every step for the step's rows: a page that gave its window page
back reads the padding page, which no window reaches.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np
import torch

from radixserve.radix import WindowPages
from radixserve.runtime.forward_batch import BatchLayout, ForwardBatch
from radixserve.runtime.platform import Platform


class _WindowPagesOf(Sequence[int]):
    """A request's page list read as window pages (lazily: most steps read a few of them)."""

    def __init__(self, pages: Sequence[int], window_of: np.ndarray):
        self._pages, self._of = pages, window_of

    def __len__(self) -> int:
        return len(self._pages)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self._of[np.asarray(self._pages[i], dtype=np.int64)].tolist()
        return int(self._of[self._pages[i]])


@dataclass
class SplitMetadata:
    full: Any                      # the global layers' backend's metadata
    windowed: Any                  # the window layers' backend's
    window_slots: torch.Tensor     # [T] where each new token's K/V go in the window pool
    views: Optional[tuple[ForwardBatch, ForwardBatch]] = None   # the step's batch as each backend sees it


class SplitAttention:
    graphs = None         # the window page table is rebuilt on the host each step: no CUDA graphs
    paged_decode = None   # the CPU's whole-layer decode takes no sliding-window layer

    def __init__(self, full, windowed, groups: tuple[tuple[bool, int], ...], windows: WindowPages,
                 page_table: torch.Tensor, window_table: torch.Tensor, platform: Platform):
        self.full, self.windowed, self.groups, self.windows = full, windowed, groups, windows
        self.table, self.window_table, self.platform = page_table, window_table, platform

    def prepare(self, layout: BatchLayout) -> SplitMetadata:
        self.windows.upload(self.platform.upload)
        rows = sorted({s.page_row for s in layout.decodes} | {s.page_row for s in layout.extends})
        idx = self.platform.upload(rows, torch.long)
        self.window_table[idx] = self.windows.map[self.table[idx]]
        of = self.windows.host_map()
        windowed = BatchLayout(layout.page_size, layout.ids, layout.positions, [], layout.sample_rows,
                               [dataclasses.replace(d, pages=_WindowPagesOf(d.pages, of)) for d in layout.decodes],
                               [dataclasses.replace(e, pages=_WindowPagesOf(e.pages, of)) for e in layout.extends])
        slots = self.windows.slots(np.asarray(layout.out_slots, dtype=np.int64))
        return SplitMetadata(self.full.prepare(layout), self.windowed.prepare(windowed),
                             self.platform.upload(slots, torch.long))

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: ForwardBatch,
                window: Optional[int] = None, sinks: Optional[torch.Tensor] = None) -> torch.Tensor:
        meta: SplitMetadata = batch.attention
        if meta.views is None:
            meta.views = (dataclasses.replace(batch, attention=meta.full),
                          dataclasses.replace(batch, attention=meta.windowed, out_slots=meta.window_slots))
        windowed, index = self.groups[layer]
        backend = self.windowed if windowed else self.full
        return backend.forward(index, q, k, v, meta.views[windowed], window, sinks)
