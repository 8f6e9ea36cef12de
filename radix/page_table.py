"""Per-request page tables as one device tensor, so a step's slot indices are gathered, not rebuilt.

Writes land in a host copy; `upload` sends the rows written since the last one to the device in a
single copy, once a step (a copy per allocation cost one host-to-device transfer per request per
page boundary). On the CPU the host copy is the table itself and `upload` has nothing to do.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np
import torch


class RequestPageTable:
    """Row `r` lists the KV pages of the request holding row `r`, in position order."""

    def __init__(self, max_requests: int, max_pages_per_request: int, device: torch.device | str = "cpu"):
        device = torch.device(device)
        self._host = np.zeros((max_requests, max_pages_per_request), dtype=np.int64)
        host = torch.from_numpy(self._host)
        self.table = host if device.type == "cpu" else torch.zeros_like(host, device=device)
        self._dirty: Optional[set[int]] = None if device.type == "cpu" else set()
        self._free_rows = list(range(max_requests - 1, -1, -1))

    @property
    def max_pages_per_request(self) -> int:
        return self.table.shape[1]

    def alloc_row(self) -> int:
        if not self._free_rows:
            raise RuntimeError("no free page-table rows")
        return self._free_rows.pop()

    def free_row(self, row: int) -> None:
        self._free_rows.append(row)

    @property
    def num_free_rows(self) -> int:
        return len(self._free_rows)

    def write(self, row: int, start: int, pages: list[int]) -> None:
        if pages:
            self._host[row, start:start + len(pages)] = pages
            if self._dirty is not None:
                self._dirty.add(row)

    def upload(self, send: Callable[[Any, torch.dtype], torch.Tensor]) -> None:
        """Copy the rows written since the last upload to the device table: `send(values, dtype)`
        moves host values to the device (the platform's one host-to-device copy)."""
        if not self._dirty:
            return
        rows = sorted(self._dirty)
        self._dirty.clear()
        flat = send(np.concatenate([np.asarray(rows, dtype=np.int64), self._host[rows].ravel()]), torch.int64)
        index, values = flat[: len(rows)], flat[len(rows):].view(len(rows), -1)
        self.table.index_copy_(0, index, values)
