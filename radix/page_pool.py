"""Free list of KV cache pages."""
from __future__ import annotations

import numpy as np


class OutOfPagesError(RuntimeError):
    pass


class KVPagePool:
    """Owns which of `num_pages` pages (each `page_size` token slots) are free.

    Slot `s` of the KV tensors belongs to page `s // page_size`. Allocation is
    LIFO so recently freed (cache-warm) pages are reused first.
    """

    def __init__(self, num_pages: int, page_size: int):
        if num_pages < 1 or page_size < 1:
            raise ValueError("num_pages and page_size must be >= 1")
        self.num_pages = num_pages
        self.page_size = page_size
        self._free: list[int] = list(range(num_pages - 1, -1, -1))
        self._is_free = np.ones(num_pages, dtype=bool)

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_slots(self) -> int:
        return self.num_pages * self.page_size

    def is_free(self, pages) -> np.ndarray:
        return self._is_free[np.asarray(pages, dtype=np.int64)]

    def alloc(self, n: int) -> list[int]:
        if n > len(self._free):
            raise OutOfPagesError(f"asked for {n} pages, {len(self._free)} free")
        if n == 0:
            return []
        pages = self._free[-n:][::-1]  # ascending: a fresh prompt gets neighbouring pages
        del self._free[-n:]
        self._is_free[pages] = False
        return pages

    def free(self, pages: list[int]) -> None:
        if not pages:
            return
        idx = np.asarray(pages, dtype=np.int64)
        if np.any(self._is_free[idx]) or len(np.unique(idx)) != len(idx):
            bad = [p for p in pages if self._is_free[p]]
            raise RuntimeError(f"double free of KV pages {bad or pages}")
        self._is_free[idx] = True
        self._free.extend(pages)
