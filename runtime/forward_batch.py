"""The flattened, ragged description of one forward step."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from radixserve.kernels.paged_attention import ExtendContext, SharedPrefixes


@dataclass
class ExtendSegment:
    """A run of new tokens of one request that attends to its cached prefix and causally to itself."""
    start: int                              # first row in the flat token batch
    length: int                             # new tokens
    prefix_len: int                         # tokens already in the KV cache
    # [prefix_len + length] slots; None when prefix_len == 0 or the backend reads the page table itself
    context_slots: Optional[torch.Tensor]
    scored: bool = False                    # the torch path attends to it in one of `scored_extends`


@dataclass
class ScoredExtend:
    """Extend segments after one cached prefix that the torch path scores in one call."""
    rows: torch.Tensor                      # [n] their rows in the flat token batch
    context: ExtendContext


@dataclass
class ForwardBatch:
    """Decode rows come first (one token each), then extend segments; no padding between requests."""
    input_ids: torch.Tensor                 # [T]
    positions: torch.Tensor                 # [T]
    out_slots: torch.Tensor                 # [T] where each new token's K/V is written
    num_decode: int
    decode_kv_rows: Optional[torch.Tensor] = None  # [num_decode, kv_heads, L] (decode_kv_rows) past any shared prefix
    decode_bias: Optional[torch.Tensor] = None     # [num_decode, 1, 1, L] float32: 0 = attend, -inf = not
    decode_value_bags: Optional[torch.Tensor] = None  # value_bags(decode_kv_rows), the same for every layer
    decode_shared: Optional[SharedPrefixes] = None  # cached prefixes that groups of decode rows share
    extends: list[ExtendSegment] = field(default_factory=list)
    scored_extends: list[ScoredExtend] = field(default_factory=list)
    sample_rows: Optional[torch.Tensor] = None  # rows whose logits are needed
    # Kernel metadata, built only for backends with `needs_kernel_metadata` (the Triton one); the
    # torch path's decode_* tensors and context_slots are then left None.
    page_table: Optional[torch.Tensor] = None   # [rows, max_pages] the request page table itself
    decode_rows: Optional[torch.Tensor] = None  # [num_decode] page-table row of each decode
    decode_lens: Optional[torch.Tensor] = None  # [num_decode] context length, the new token included
    decode_max_len: int = 0                     # host-side bound on decode_lens (sizes the split count)
    extend_meta: Optional[torch.Tensor] = None  # int64 [4, segments]: start row, length, prefix_len, page row
    extend_max_len: int = 0                     # longest segment (sizes the extend grid)

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]
