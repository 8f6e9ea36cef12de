"""The flattened, ragged description of one forward step."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch


@dataclass
class ExtendSegment:
    """A run of new tokens of one request that attends to its cached prefix and causally to itself."""
    start: int                              # first row in the flat token batch
    length: int                             # new tokens
    prefix_len: int                         # tokens already in the KV cache
    context_slots: Optional[torch.Tensor]   # [prefix_len + length] slots; None when prefix_len == 0


@dataclass
class ForwardBatch:
    """Decode rows come first (one token each), then extend segments; no padding between requests."""
    input_ids: torch.Tensor                 # [T]
    positions: torch.Tensor                 # [T]
    out_slots: torch.Tensor                 # [T] where each new token's K/V is written
    num_decode: int
    decode_pages: Optional[torch.Tensor]    # [num_decode, max_pages] page table rows (padded)
    decode_mask: Optional[torch.Tensor]     # [num_decode, 1, 1, max_pages * page_size] True = attend
    extends: list[ExtendSegment] = field(default_factory=list)
    sample_rows: Optional[torch.Tensor] = None  # rows whose logits are needed

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]
