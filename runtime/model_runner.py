"""Turns a scheduled batch into one ragged forward pass and returns the logits to sample from."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch

from radixserve.kernels.paged_attention import SharedPrefixes, attention_bias, decode_kv_rows, extend_context, value_bags
from radixserve.radix import RequestPageTable, common_prefix_len
from radixserve.runtime.attention import AttentionBackend
from radixserve.runtime.cuda_graph import DecodeGraphRunner
from radixserve.runtime.forward_batch import ExtendSegment, ForwardBatch, ScoredExtend
from radixserve.runtime.request import Request
from radixserve.runtime.scheduler import ScheduledBatch


# Attending to shared prefixes costs ~35 more small ops per layer whatever the number of groups,
# paid back by gathering and scoring each prefix once instead of once per member: worth it from
# about this many tokens of saved work, (members - 1) x shared tokens summed over the groups.
MIN_SHARED_DECODE_SAVING = 4096
# A group saving less than this is left out: it would pad the others to its shape for little.
MIN_GROUP_SAVING = 256
# The shared prefixes' K/V stay gathered from one step to the next (when the prefixes are the same
# pages) up to this size for all layers together; larger ones are gathered again every step.
MAX_KEPT_PREFIX_BYTES = 256 << 20


def shared_prefix_groups(reqs: list[Request], page_size: int) -> list[tuple[list[int], int]]:
    """(indices, shared pages) of each group of decoding requests whose contexts start on the
    same cached pages (radix-tree hits on one system prompt); [] when sharing would not pay."""
    by_first_page: dict[int, list[int]] = defaultdict(list)
    for i, r in enumerate(reqs):
        by_first_page[r.pages[0]].append(i)
    groups = []
    for members in by_first_page.values():
        if len(members) < 2:
            continue
        # whole pages before each request's newest position: those are never written to again
        full = [reqs[i].pages[: reqs[i].kv_len // page_size] for i in members]
        prefix = full[0]
        for pages in full[1:]:
            prefix = prefix[: common_prefix_len(prefix, pages, 1)]
        if (len(members) - 1) * len(prefix) * page_size >= MIN_GROUP_SAVING:
            groups.append((members, len(prefix)))
    saving = sum((len(members) - 1) * shared * page_size for members, shared in groups)
    # in page order, so that the same prefixes give the same layout from step to step
    return sorted(groups, key=lambda g: reqs[g[0][0]].pages[0]) if saving >= MIN_SHARED_DECODE_SAVING else []


@dataclass
class TokenRows:
    """Host-side lists for one step's flat token batch."""
    ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    out_slots: list[int] = field(default_factory=list)
    sample_rows: list[int] = field(default_factory=list)
    segments: list[tuple[int, int, int, int]] = field(default_factory=list)  # start, length, prefix, page row


class ModelRunner:
    def __init__(self, model, attention: AttentionBackend, page_table: RequestPageTable, page_size: int,
                 pad_page: int, device: torch.device):
        self.pad_page = pad_page
        self.kv_heads = model.cfg.num_kv_heads
        self.query_group = model.cfg.num_heads // model.cfg.num_kv_heads  # query heads per KV head
        self.model = model
        self.attention = attention
        self.table = page_table.table
        self.page_size = page_size
        self.device = device
        self._page_offsets = torch.arange(page_size, device=device)
        # the Triton backend reads the page table in its kernels; the torch one wants gathered slots
        self.kernel_metadata = bool(getattr(attention, "needs_kernel_metadata", False))
        self.graphs: DecodeGraphRunner | None = None
        # (pages of each shared prefix, their gathered K/V by layer) of the previous step, if it had any
        self._kept_prefixes: tuple[tuple, dict] | None = None

    def enable_decode_graphs(self, max_batch: int, max_context_len: int, capture: bool = True) -> None:
        """Replay pure-decode steps from CUDA graphs (capture=False: the same padded static batches,
        run eagerly; for tests without CUDA). Needs a backend that reads kernel metadata."""
        if not self.kernel_metadata:
            raise ValueError("decode graphs need an attention backend that reads the page table (triton)")
        pad_slot = self.pad_page * self.page_size
        self.graphs = DecodeGraphRunner(self.model, self.attention, self.table, max_batch, max_context_len,
                                        pad_slot, capture=capture)

    def _slots(self, rows: torch.Tensor, length: int) -> torch.Tensor:
        """[len(rows), length] slot of each position 0..length-1 of the requests in page-table `rows`."""
        p = self.page_size
        pages = self.table[rows, : -(-length // p)]
        if p == 1:
            return pages
        return (pages.unsqueeze(-1) * p + self._page_offsets).flatten(1)[:, :length]

    def _token_rows(self, batch: ScheduledBatch) -> "TokenRows":
        """The flat token rows of a step: decodes first, then each extend segment."""
        p = self.page_size
        rows = TokenRows()
        for item in batch.decodes:
            r = item.req
            rows.ids.append(r.token_ids[r.kv_len])
            rows.positions.append(r.kv_len)
            rows.out_slots.append(r.pages[r.kv_len // p] * p + r.kv_len % p)
            rows.sample_rows.append(len(rows.ids) - 1)
        for item in batch.extends:
            r, n, start = item.req, item.num_tokens, len(rows.ids)
            rows.ids.extend(r.token_ids[r.kv_len: r.kv_len + n])
            pos = range(r.kv_len, r.kv_len + n)
            rows.positions.extend(pos)
            rows.out_slots.extend(r.pages[q // p] * p + q % p for q in pos)
            rows.segments.append((start, n, r.kv_len, r.page_row))
            if item.samples:
                rows.sample_rows.append(start + n - 1)
        return rows

    def build(self, batch: ScheduledBatch) -> ForwardBatch:
        if self.kernel_metadata:
            return self._build_for_kernels(batch)
        p = self.page_size
        rows = self._token_rows(batch)
        extends = []
        for start, n, prefix_len, page_row in rows.segments:
            ctx = None
            if prefix_len:
                ctx = self._slots(torch.tensor([page_row], device=self.device), prefix_len + n)[0]
            extends.append(ExtendSegment(start, n, prefix_len, ctx))
        scored = self._scored_extends(extends, [item.req for item in batch.extends])

        kv_rows = decode_bias = bags = shared = None
        if batch.decodes:
            reqs = [it.req for it in batch.decodes]
            groups = shared_prefix_groups(reqs, p)
            shared_pages = [0] * len(reqs)
            for members, n in groups:
                for i in members:
                    shared_pages[i] = n
            kv_rows, decode_bias = self._decode_rows(reqs, shared_pages)
            bags = value_bags(kv_rows, self.query_group)
            shared = self._shared_prefixes(reqs, groups) if groups else None
        if shared is None:
            self._kept_prefixes = None

        def t(xs):
            return torch.tensor(xs, dtype=torch.long, device=self.device)

        return ForwardBatch(input_ids=t(rows.ids), positions=t(rows.positions), out_slots=t(rows.out_slots),
                            num_decode=len(batch.decodes), decode_kv_rows=kv_rows, decode_bias=decode_bias,
                            decode_value_bags=bags, decode_shared=shared, extends=extends,
                            scored_extends=scored, sample_rows=t(rows.sample_rows))

    def _scored_extends(self, extends: list[ExtendSegment], reqs: list[Request]) -> list[ScoredExtend]:
        """Segments after a cached prefix to score, those after the same whole pages in one call (a
        wave of requests on one system prompt); marks each segment it covers."""
        p = self.page_size
        by_prefix: dict[tuple, list[int]] = defaultdict(list)
        for i, (seg, r) in enumerate(zip(extends, reqs)):
            if seg.prefix_len:
                shareable = seg.prefix_len % p == 0   # a partly filled page is the request's own
                by_prefix[("pages", *r.pages[: seg.prefix_len // p]) if shareable else ("own", i)].append(i)
        scored = []
        for members in by_prefix.values():
            together = self._scored(extends, members)
            if together is not None:
                scored.append(together)
            elif len(members) > 1:   # too large together: one call each where that pays
                scored.extend(s for s in (self._scored(extends, [i]) for i in members) if s is not None)
        return scored

    def _scored(self, extends: list[ExtendSegment], members: list[int]) -> ScoredExtend | None:
        """One scored call for segments `members` (all after the same prefix), or None for SDPA."""
        first = extends[members[0]]
        context = extend_context(first.context_slots[: first.prefix_len],
                                 [extends[i].context_slots[extends[i].prefix_len:] for i in members],
                                 self.kv_heads, self.kv_heads * self.query_group)
        if context is None:
            return None
        for i in members:
            extends[i].scored = True
        rows = [torch.arange(extends[i].start, extends[i].start + extends[i].length) for i in members]
        return ScoredExtend(torch.cat(rows).to(self.device), context)

    def _decode_rows(self, reqs: list[Request], shared_pages: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """kv_rows and attention bias of each decode's context past its first `shared_pages` pages."""
        p = self.page_size
        skip = torch.tensor(shared_pages, device=self.device)
        lens = torch.tensor([r.kv_len + 1 for r in reqs], device=self.device) - skip * p
        page_rows = torch.tensor([r.page_row for r in reqs], device=self.device)
        n_pages = -(-int(lens.max()) // p)
        columns = (skip.unsqueeze(1) + torch.arange(n_pages, device=self.device)).clamp_(max=self.table.shape[1] - 1)
        return self._rows_and_bias(self.table[page_rows.unsqueeze(1), columns], lens)

    def _rows_and_bias(self, pages: torch.Tensor, lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`decode_kv_rows` and `attention_bias` of contexts of `lens` tokens on `pages` [N, n]."""
        p, dev = self.page_size, self.device
        n_pages = pages.shape[1]
        # pages past a context's end read the zeroed padding page, never a stale one
        page_used = torch.arange(n_pages, device=dev) * p < lens.unsqueeze(1)
        pages = pages.masked_fill(~page_used, self.pad_page)
        attend = (torch.arange(n_pages * p, device=dev) < lens.unsqueeze(1))[:, None, None, :]
        return decode_kv_rows(pages, p, self.kv_heads), attention_bias(attend)

    def _shared_prefixes(self, reqs: list[Request], groups: list[tuple[list[int], int]]) -> SharedPrefixes:
        p, dev = self.page_size, self.device
        n_pages = max(n for _, n in groups)
        first = torch.tensor([reqs[members[0]].page_row for members, _ in groups], device=dev)
        kv_rows, bias = self._rows_and_bias(self.table[first, :n_pages],
                                            torch.tensor([n * p for _, n in groups], device=dev))
        # Last step's gathered K/V are still right if its prefixes were these same pages: a decode's
        # shared pages were locked since before last step's forward (its first step was a prefill),
        # so none was freed and rewritten in between. Any step without prefixes drops them.
        key = tuple(tuple(reqs[members[0]].pages[:n]) for members, n in groups)
        kept = self._kept_prefixes
        cfg = self.model.cfg
        size = 2 * cfg.num_layers * kv_rows.numel() * cfg.head_dim * self.model.dtype.itemsize
        layer_kv = None  # too large to hold for every layer: each layer gathers and drops its own
        if size <= MAX_KEPT_PREFIX_BYTES:
            layer_kv = kept[1] if kept is not None and kept[0] == key else {}
        self._kept_prefixes = None if layer_kv is None else (key, layer_kv)
        return SharedPrefixes.of_groups(kv_rows, bias, [members for members, _ in groups], len(reqs),
                                        self.query_group, layer_kv=layer_kv)

    def _build_for_kernels(self, batch: ScheduledBatch) -> ForwardBatch:
        """The batch as the Triton kernels want it: every index tensor is a view of one int64
        buffer, so a step costs one host-to-device copy whatever its shape."""
        rows = self._token_rows(batch)
        dec_rows = [it.req.page_row for it in batch.decodes]
        dec_lens = [it.req.kv_len + 1 for it in batch.decodes]
        meta = [list(column) for column in zip(*rows.segments)] or [[], [], [], []]  # start, length, prefix, row
        t, nd, ne, ns = len(rows.ids), len(dec_rows), len(rows.segments), len(rows.sample_rows)
        flat = torch.tensor(rows.ids + rows.positions + rows.out_slots + rows.sample_rows + dec_rows + dec_lens
                            + sum(meta, []), dtype=torch.long).to(self.device, non_blocking=True)
        parts = flat.split([t, t, t, ns, nd, nd, 4 * ne])
        extends = [ExtendSegment(start, n, prefix_len, None) for start, n, prefix_len, _ in rows.segments]
        return ForwardBatch(input_ids=parts[0], positions=parts[1], out_slots=parts[2], num_decode=nd,
                            extends=extends, sample_rows=parts[3],
                            page_table=self.table, decode_rows=parts[4] if nd else None,
                            decode_lens=parts[5] if nd else None, decode_max_len=max(dec_lens, default=0),
                            extend_meta=parts[6].view(4, ne) if ne else None,
                            extend_max_len=max(meta[1], default=0))

    def forward(self, batch: ScheduledBatch) -> torch.Tensor:
        """Logits [rows that sample, vocab], in the order of `batch.items` that sample."""
        if self.graphs is not None and not batch.extends:
            p = self.page_size
            reqs = [item.req for item in batch.decodes]
            logits = self.graphs.run([[r.token_ids[r.kv_len] for r in reqs], [r.kv_len for r in reqs],
                                      [r.pages[r.kv_len // p] * p + r.kv_len % p for r in reqs],
                                      [r.page_row for r in reqs], [r.kv_len + 1 for r in reqs]])
            if logits is not None:
                return logits
        fb = self.build(batch)
        return self.model.forward(fb, self.attention)
