"""Turns a scheduled batch into one ragged forward pass and returns the logits to sample from."""
from __future__ import annotations

import torch

from radix import RequestPageTable
from runtime.attention import AttentionBackend
from runtime.forward_batch import ExtendSegment, ForwardBatch
from runtime.scheduler import ScheduledBatch


class ModelRunner:
    def __init__(self, model, attention: AttentionBackend, page_table: RequestPageTable, page_size: int,
                 pad_page: int, device: torch.device):
        self.pad_page = pad_page
        self.model = model
        self.attention = attention
        self.table = page_table.table
        self.page_size = page_size
        self.device = device
        self._page_offsets = torch.arange(page_size, device=device)

    def _slots(self, rows: torch.Tensor, length: int) -> torch.Tensor:
        """[len(rows), length] slot of each position 0..length-1 of the requests in page-table `rows`."""
        p = self.page_size
        pages = self.table[rows, : -(-length // p)]
        if p == 1:
            return pages
        return (pages.unsqueeze(-1) * p + self._page_offsets).flatten(1)[:, :length]

    def build(self, batch: ScheduledBatch) -> ForwardBatch:
        p = self.page_size
        ids: list[int] = []
        positions: list[int] = []
        out_slots: list[int] = []
        sample_rows: list[int] = []
        for item in batch.decodes:
            r = item.req
            ids.append(r.token_ids[r.kv_len])
            positions.append(r.kv_len)
            out_slots.append(r.pages[r.kv_len // p] * p + r.kv_len % p)
            sample_rows.append(len(ids) - 1)
        extends = []
        for item in batch.extends:
            r, n, start = item.req, item.num_tokens, len(ids)
            ids.extend(r.token_ids[r.kv_len: r.kv_len + n])
            pos = range(r.kv_len, r.kv_len + n)
            positions.extend(pos)
            out_slots.extend(r.pages[q // p] * p + q % p for q in pos)
            ctx = None
            if r.kv_len:
                ctx = self._slots(torch.tensor([r.page_row], device=self.device), r.kv_len + n)[0]
            extends.append(ExtendSegment(start, n, r.kv_len, ctx))
            if item.samples:
                sample_rows.append(start + n - 1)

        decode_pages = decode_mask = None
        if batch.decodes:
            lens = torch.tensor([it.req.kv_len + 1 for it in batch.decodes], device=self.device)
            rows = torch.tensor([it.req.page_row for it in batch.decodes], device=self.device)
            n_pages = -(-int(lens.max()) // p)
            decode_pages = self.table[rows, :n_pages]
            # pages past a request's end read the zeroed padding page, never a stale one
            page_used = torch.arange(n_pages, device=self.device) * p < lens.unsqueeze(1)
            decode_pages = decode_pages.masked_fill(~page_used, self.pad_page)
            decode_mask = (torch.arange(n_pages * p, device=self.device) < lens.unsqueeze(1))[:, None, None, :]

        def t(xs):
            return torch.tensor(xs, dtype=torch.long, device=self.device)

        return ForwardBatch(input_ids=t(ids), positions=t(positions), out_slots=t(out_slots),
                            num_decode=len(batch.decodes), decode_pages=decode_pages, decode_mask=decode_mask,
                            extends=extends, sample_rows=t(sample_rows))

    def forward(self, batch: ScheduledBatch) -> torch.Tensor:
        """Logits [rows that sample, vocab], in the order of `batch.items` that sample."""
        fb = self.build(batch)
        return self.model.forward(fb, self.attention)
