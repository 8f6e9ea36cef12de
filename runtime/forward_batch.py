"""One forward step: the backend-neutral layout the model runner builds on the host, and the
device tensors the model runs on.

Attention backends build their own metadata from a `BatchLayout` (`backend.prepare`); the model
and the runner never look inside it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch

from radixserve.runtime.platform import Platform


def output_slot(pages: Sequence[int], position: int, page_size: int) -> int:
    """The KV slot that the token at `position` of a request holding `pages` is written to."""
    return pages[position // page_size] * page_size + position % page_size


@dataclass(frozen=True)
class DecodeSeq:
    """A decoding request: one new token, the last of its context."""
    page_row: int          # its row of the request page table
    context_len: int       # tokens it attends to, the new one included
    pages: Sequence[int]   # its KV pages in position order (read only)


@dataclass(frozen=True)
class ExtendSeq:
    """New tokens of one request: they attend to its cached prefix and causally to each other."""
    start: int             # first row in the flat token batch
    length: int            # new tokens
    prefix_len: int        # tokens already in the KV cache
    page_row: int
    pages: Sequence[int]


@dataclass
class BatchLayout:
    """A step's flat token batch on the host: decode rows first (one token each), then extend
    segments, no padding between requests."""
    page_size: int
    ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    out_slots: list[int] = field(default_factory=list)
    sample_rows: list[int] = field(default_factory=list)   # rows whose logits are needed
    decodes: list[DecodeSeq] = field(default_factory=list)
    extends: list[ExtendSeq] = field(default_factory=list)

    def add_decode(self, token: int, position: int, page_row: int, pages: Sequence[int], samples: bool = True) -> None:
        """A request's token at `position`, attending to its context up to itself; `samples`: its
        logits are needed (a request's newest token, not one of a forced run before it)."""
        self.decodes.append(DecodeSeq(page_row, position + 1, pages))
        if samples:
            self.sample_rows.append(len(self.ids))
        self.ids.append(token)
        self.positions.append(position)
        self.out_slots.append(output_slot(pages, position, self.page_size))

    def add_extend(self, token_ids: Sequence[int], kv_len: int, n: int, page_row: int, pages: Sequence[int],
                   samples: bool) -> None:
        """Positions kv_len .. kv_len + n - 1 of a request; `samples`: the last one's logits are needed."""
        self.extends.append(ExtendSeq(len(self.ids), n, kv_len, page_row, pages))
        self._add_tokens(token_ids, kv_len, n, pages)
        if samples:
            self.sample_rows.append(len(self.ids) - 1)

    def _add_tokens(self, token_ids: Sequence[int], start: int, n: int, pages: Sequence[int]) -> None:
        p = self.page_size
        self.ids.extend(token_ids[start:start + n])
        self.positions.extend(range(start, start + n))
        self.out_slots.extend(output_slot(pages, q, p) for q in range(start, start + n))

    @property
    def num_decode(self) -> int:
        return len(self.decodes)


@dataclass
class ForwardBatch:
    """What the model runs on: the flat token rows on the device, and the attention backend's
    metadata for them (opaque to everyone but that backend)."""
    input_ids: torch.Tensor                 # [T]
    positions: torch.Tensor                 # [T]
    out_slots: torch.Tensor                 # [T] where each new token's K/V is written
    sample_rows: Optional[torch.Tensor]     # rows whose logits are returned; None: all rows
    attention: Any = None                   # from AttentionBackend.prepare
    paged_decode: Any = None                # the backend's `paged_decode` of it, where the model fuses layers

    @classmethod
    def of(cls, layout: BatchLayout, attention: Any, platform: Platform, paged_decode: Any = None) -> "ForwardBatch":
        """The layout's rows in one host-to-device copy. Where every row samples, in order (a step of
        decodes), `sample_rows` is None: the model then gathers no rows (an index op right after a
        step's layers costs ~0.1 ms on a CPU whose caches the weights have just streamed through)."""
        t, ns = len(layout.ids), len(layout.sample_rows)
        every = ns == t and layout.sample_rows == list(range(t))
        rows = [] if every else layout.sample_rows
        flat = platform.upload(layout.ids + layout.positions + layout.out_slots + rows, torch.long)
        ids, positions, slots, sample_rows = flat.split([t, t, t, len(rows)])
        return cls(ids, positions, slots, None if every else sample_rows, attention, paged_decode)

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]
