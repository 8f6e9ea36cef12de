"""Turns a scheduled batch into one ragged forward pass and returns the logits to sample from."""
from __future__ import annotations

import torch

from radix import RequestPageTable
from runtime.attention import AttentionBackend
from runtime.forward_batch import ExtendSegment, ForwardBatch, SharedPrefixGroup
from runtime.scheduler import ScheduledBatch


# A group's shared prefix is read once for all its members; below this many tokens saved
# (shared tokens x extra members) the extra attention calls per layer cost more than they save.
MIN_SHARED_TOKENS_SAVED = 256


def shared_prefix_groups(reqs: list, page_size: int) -> list[tuple[list[int], int]]:
    """Decodes whose page tables start with the same pages (a prompt prefix shared through the
    radix tree): (member indices, number of common leading pages) for groups worth cascading."""
    by_first: dict[int, list[int]] = {}
    for i, r in enumerate(reqs):
        if r.pages:
            by_first.setdefault(r.pages[0], []).append(i)
    groups = []
    for members in by_first.values():
        if len(members) < 2:
            continue
        first = reqs[members[0]].pages
        n = min(len(reqs[i].pages) for i in members)
        for i in members[1:]:
            pages = reqs[i].pages
            k = 0
            while k < n and pages[k] == first[k]:
                k += 1
            n = k
        # the page holding a decode's new token is its own, so common pages are whole cached pages
        if n and n * page_size * (len(members) - 1) >= MIN_SHARED_TOKENS_SAVED:
            groups.append((members, n))
    return groups


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
        groups: list[SharedPrefixGroup] = []
        if batch.decodes:
            reqs = [it.req for it in batch.decodes]
            shared = [0] * len(reqs)  # leading pages each decode reads through its group instead
            for members, n_shared in shared_prefix_groups(reqs, p):
                for i in members:
                    shared[i] = n_shared
                groups.append(SharedPrefixGroup(torch.tensor(members, device=self.device),
                                                torch.tensor(reqs[members[0]].pages[:n_shared], device=self.device)))
            # each decode's own pages, padded with the zeroed padding page (never a stale one)
            own = [r.pages[s: -(-(r.kv_len + 1) // p)] for r, s in zip(reqs, shared)]
            width = max(len(o) for o in own)
            decode_pages = torch.tensor([o + [self.pad_page] * (width - len(o)) for o in own], device=self.device)
            lens = torch.tensor([r.kv_len + 1 - s * p for r, s in zip(reqs, shared)], device=self.device)
            decode_mask = (torch.arange(width * p, device=self.device) < lens.unsqueeze(1))[:, None, None, :]

        def t(xs):
            return torch.tensor(xs, dtype=torch.long, device=self.device)

        return ForwardBatch(input_ids=t(ids), positions=t(positions), out_slots=t(out_slots),
                            num_decode=len(batch.decodes), decode_pages=decode_pages, decode_mask=decode_mask,
                            extends=extends, sample_rows=t(sample_rows), shared_prefix_groups=groups)

    def forward(self, batch: ScheduledBatch) -> torch.Tensor:
        """Logits [rows that sample, vocab], in the order of `batch.items` that sample."""
        fb = self.build(batch)
        return self.model.forward(fb, self.attention)
