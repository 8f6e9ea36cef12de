"""The sliding-window layers' own pages: a second, smaller pool, and which of them each KV page has.

A model whose layers alternate local (sliding-window) and global attention keeps the local layers'
K/V in a pool of its own. Every KV page (global layers, every position) may own one window page
(local layers, the same positions); a page whose positions fell out of every window that could
still read them gives its window page back and keeps only its global part. Attention then reads a
local layer's page `p` at window page `map[p]`, the padding window page where `p` has none.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np
import torch

from radixserve.radix.page_pool import KVPagePool

NONE = -1


class WindowPages:
    def __init__(self, num_pages: int, num_window_pages: int, page_size: int, device: torch.device | str = "cpu"):
        self.pool = KVPagePool(num_window_pages, page_size)
        self.page_size = page_size
        self._of = np.full(num_pages, NONE, dtype=np.int64)   # KV page -> its window page or NONE
        # what attention gathers through: one more entry for the KV padding page, and NONE read as
        # the window padding page
        self._host = np.full(num_pages + 1, num_window_pages, dtype=np.int64)
        host = torch.from_numpy(self._host)
        device = torch.device(device)
        self.map = host if device.type == "cpu" else host.to(device)
        # entries changed since the last upload (on the CPU the map is the host array itself)
        self._dirty: Optional[list[np.ndarray]] = None if device.type == "cpu" else []

    @property
    def num_free(self) -> int:
        return self.pool.num_free

    @property
    def num_pages(self) -> int:
        return self.pool.num_pages

    def of(self, page: int) -> int:
        """The window page of KV page `page`, or NONE."""
        return int(self._of[page])

    def has(self, pages: list[int]) -> np.ndarray:
        return self._of[np.asarray(pages, dtype=np.int64)] != NONE

    def attached(self) -> np.ndarray:
        """The KV pages that have a window page."""
        return np.flatnonzero(self._of != NONE)

    def host_map(self) -> np.ndarray:
        """KV page -> window page, the padding window page where there is none (read only)."""
        return self._host

    def attach(self, pages: list[int]) -> None:
        """Give each of `pages` (none of which has one) a window page."""
        if not pages:
            return
        idx = np.asarray(pages, dtype=np.int64)
        if np.any(self._of[idx] != NONE):
            raise RuntimeError(f"KV pages {[p for p in pages if self._of[p] != NONE]} already have window pages")
        self._set(idx, np.asarray(self.pool.alloc(len(pages)), dtype=np.int64))

    def detach(self, pages: list[int]) -> int:
        """Free the window pages of those of `pages` that have one; returns how many."""
        if not pages:
            return 0
        idx = np.asarray(pages, dtype=np.int64)
        own = self._of[idx]
        keep = own != NONE
        self.pool.free(own[keep].tolist())
        self._set(idx[keep], np.full(int(keep.sum()), NONE, dtype=np.int64))
        return int(keep.sum())

    def move(self, src: int, dst: int) -> None:
        """Hand `src`'s window page to `dst` (which has none): a copy of a cached page computed again."""
        if self._of[dst] != NONE:
            raise RuntimeError(f"KV page {dst} already has a window page")
        w = self._of[src]
        self._set(np.array([src, dst]), np.array([NONE, w]))

    def _set(self, idx: np.ndarray, window: np.ndarray) -> None:
        self._of[idx] = window
        self._host[idx] = np.where(window == NONE, self.pool.num_pages, window)
        if self._dirty is not None:
            self._dirty.append(idx.copy())

    def upload(self, send: Callable[[Any, torch.dtype], torch.Tensor]) -> None:
        """Copy the entries changed since the last upload to the device map, in one copy."""
        if not self._dirty:
            return
        idx = np.unique(np.concatenate(self._dirty))
        self._dirty.clear()
        flat = send(np.concatenate([idx, self._host[idx]]), torch.int64)
        self.map.index_copy_(0, flat[:len(idx)], flat[len(idx):])

    def slots(self, slots: np.ndarray) -> np.ndarray:
        """KV slot indices -> the same positions' slots in the window pool."""
        p = self.page_size
        return self._host[slots // p] * p + slots % p
