"""Per-request page tables as one device tensor, so a step's slot indices are gathered, not rebuilt."""
from __future__ import annotations

import torch


class RequestPageTable:
    """Row `r` lists the KV pages of the request holding row `r`, in position order."""

    def __init__(self, max_requests: int, max_pages_per_request: int, device: torch.device | str = "cpu"):
        self.table = torch.zeros(max_requests, max_pages_per_request, dtype=torch.int64, device=device)
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
            self.table[row, start:start + len(pages)] = torch.tensor(pages, dtype=torch.int64)
