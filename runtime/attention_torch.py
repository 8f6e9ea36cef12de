"""Attention on host torch ops (the CPU paths): a backend composed of the torch extend path and a
decode path chosen at build: the torch one here (one batched call; cached prefixes that several
decodes share are scored once for all of them), or the C++ kernels' (runtime/attention_cpu.py).
Extends: one call per group of segments after the same cached prefix, SDPA for the rest."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol

import torch

from radixserve.kernels.paged_attention import (ExtendContext, SharedPrefixes, attention_bias, decode_attention,
                                                decode_kv_rows, extend_attention, extend_context,
                                                scored_extend_attention, value_bags, write_kv)
from radixserve.radix import common_prefix_len
from radixserve.runtime.forward_batch import BatchLayout, DecodeSeq, ExtendSeq, ForwardBatch
from radixserve.runtime.kv_cache import KVCache

# Attending to shared prefixes costs ~35 more small ops per layer whatever the number of groups,
# paid back by gathering and scoring each prefix once instead of once per member: worth it from
# about this many tokens of saved work, (members - 1) x shared tokens summed over the groups.
MIN_SHARED_DECODE_SAVING = 4096
# A group saving less than this is left out: it would pad the others to its shape for little.
MIN_GROUP_SAVING = 256
# The shared prefixes' K/V stay gathered from one step to the next (when the prefixes are the same
# pages) up to this size for all layers together; larger ones are gathered again every step.
MAX_KEPT_PREFIX_BYTES = 256 << 20


def shared_prefix_groups(decodes: list[DecodeSeq], page_size: int, min_group_saving: Optional[int] = None,
                         min_saving: Optional[int] = None) -> list[tuple[list[int], int]]:
    """(indices, shared pages) of each group of decodes whose contexts start on the same cached
    pages (radix-tree hits on one system prompt); [] when sharing would not pay. Savings are
    counted in tokens not read twice; the thresholds default to this backend's."""
    min_group_saving = MIN_GROUP_SAVING if min_group_saving is None else min_group_saving
    min_saving = MIN_SHARED_DECODE_SAVING if min_saving is None else min_saving
    by_first_page: dict[int, list[int]] = defaultdict(list)
    for i, d in enumerate(decodes):
        by_first_page[d.pages[0]].append(i)
    groups = []
    for members in by_first_page.values():
        if len(members) < 2:
            continue
        # whole pages before each request's newest position: those are never written to again
        full = [decodes[i].pages[: (decodes[i].context_len - 1) // page_size] for i in members]
        prefix = full[0]
        for pages in full[1:]:
            prefix = prefix[: common_prefix_len(prefix, pages, 1)]
        if (len(members) - 1) * len(prefix) * page_size >= max(1, min_group_saving):
            groups.append((members, len(prefix)))
    saving = sum((len(members) - 1) * shared * page_size for members, shared in groups)
    # in page order, so that the same prefixes give the same layout from step to step
    return sorted(groups, key=lambda g: decodes[g[0][0]].pages[0]) if saving >= min_saving else []


@dataclass
class SdpaExtend:
    """An extend segment attended with SDPA."""
    rows: slice                             # its rows in the flat token batch
    prefix_len: int
    context_slots: Optional[torch.Tensor]   # [prefix_len + length] slots; None without a prefix


@dataclass
class ScoredExtend:
    """Extend segments after one cached prefix, scored in one call."""
    rows: torch.Tensor                      # [n] their rows in the flat token batch
    context: ExtendContext
    segments: list[int]                     # which of the layout's extends


@dataclass
class TorchDecodeMetadata:
    kv_rows: torch.Tensor                   # [num_decode, kv_heads, L] past any shared prefix
    bias: torch.Tensor                      # [num_decode, 1, 1, L] float32: 0 = attend, -inf = not
    value_bags: torch.Tensor                # value_bags(kv_rows), the same for every layer
    shared: Optional[SharedPrefixes]        # cached prefixes that groups of decodes share
    # the sliding-window layers' own (kv_rows, bias, value_bags): only the pages the window reaches
    window: Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None


@dataclass
class HostAttentionMetadata:
    num_decode: int
    decodes: Any = None                     # the decode path's own metadata (None without decodes)
    sdpa_extends: list[SdpaExtend] = field(default_factory=list)
    scored_extends: list[ScoredExtend] = field(default_factory=list)


class DecodePath(Protocol):
    """How a host backend attends its decode rows; each path builds its own metadata."""

    def prepare(self, decodes: list[DecodeSeq]) -> Any:
        """Called every step, with [] for a step without decodes (None is then the metadata)."""
        ...

    def forward(self, layer: int, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                meta: Any, window: Optional[int] = None, sinks: Optional[torch.Tensor] = None) -> torch.Tensor: ...


class TorchExtends:
    """Extend segments: those after the same cached whole pages scored in one call, SDPA for the rest
    (all of them for a model with sliding windows or attention sinks, which the scored call does not take)."""

    def __init__(self, kv_cache: KVCache, page_table: torch.Tensor, num_heads: int, window: Optional[int] = None,
                 share: bool = True):
        self.kv, self.table, self.heads, self.window = kv_cache, page_table, num_heads, window
        self.share = share and window is None
        _, _, self.page_size, self.kv_heads, head_dim = kv_cache.k.shape
        self.scale = head_dim ** -0.5
        self.device = page_table.device
        self._page_offsets = torch.arange(self.page_size, device=self.device)

    def prepare(self, extends: list[ExtendSeq], meta: HostAttentionMetadata) -> None:
        contexts = [self._context_slots(s) if s.prefix_len else None for s in extends]
        meta.scored_extends, scored = self._scored_extends(extends, contexts) if self.share else ([], set())
        meta.sdpa_extends = [SdpaExtend(slice(s.start, s.start + s.length), s.prefix_len, ctx)
                             for i, (s, ctx) in enumerate(zip(extends, contexts)) if i not in scored]

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, meta: HostAttentionMetadata, out: torch.Tensor,
                window: Optional[int] = None, sinks: Optional[torch.Tensor] = None) -> None:
        for scored in meta.scored_extends:
            out.index_copy_(0, scored.rows, scored_extend_attention(q.index_select(0, scored.rows), k_cache,
                                                                    v_cache, scored.context, self.scale))
        for seg in meta.sdpa_extends:
            rows = seg.rows
            out[rows] = extend_attention(q[rows], k[rows], v[rows], k_cache, v_cache,
                                         seg.context_slots, seg.prefix_len, self.scale, window, sinks)

    def _context_slots(self, seg: ExtendSeq) -> torch.Tensor:
        """[prefix_len + length] slot of each position of the segment's context."""
        p, length = self.page_size, seg.prefix_len + seg.length
        pages = self.table[seg.page_row, : -(-length // p)]
        if p == 1:
            return pages
        return (pages.unsqueeze(-1) * p + self._page_offsets).flatten()[:length]

    def _scored_extends(self, extends: list[ExtendSeq], contexts: list[Optional[torch.Tensor]]
                        ) -> tuple[list[ScoredExtend], set[int]]:
        """Segments after a cached prefix to score, those after the same whole pages in one call (a
        wave of requests on one system prompt), and which segments they cover."""
        p = self.page_size
        by_prefix: dict[tuple, list[int]] = defaultdict(list)
        for i, seg in enumerate(extends):
            if seg.prefix_len:
                shareable = seg.prefix_len % p == 0   # a partly filled page is the request's own
                by_prefix[("pages", *seg.pages[: seg.prefix_len // p]) if shareable else ("own", i)].append(i)
        scored: list[ScoredExtend] = []
        for members in by_prefix.values():
            together = self._scored(extends, contexts, members)
            if together is not None:
                scored.append(together)
            elif len(members) > 1:   # too large together: one call each where that pays
                scored.extend(s for s in (self._scored(extends, contexts, [i]) for i in members) if s is not None)
        return scored, {i for s in scored for i in s.segments}

    def _scored(self, extends: list[ExtendSeq], contexts: list[Optional[torch.Tensor]],
                members: list[int]) -> Optional[ScoredExtend]:
        """One scored call for segments `members` (all after the same prefix), or None for SDPA."""
        prefix_len = extends[members[0]].prefix_len
        context = extend_context(contexts[members[0]][:prefix_len],
                                 [contexts[i][extends[i].prefix_len:] for i in members], self.kv_heads, self.heads)
        if context is None:
            return None
        rows = [r for i in members for r in range(extends[i].start, extends[i].start + extends[i].length)]
        return ScoredExtend(torch.tensor(rows, device=self.device), context, members)



class TorchDecodes:
    """Decodes in one batched torch call; the K/V of shared prefixes may stay gathered across steps
    (not with sliding windows, whose masks start where each request's window does, nor sinks)."""

    def __init__(self, kv_cache: KVCache, page_table: torch.Tensor, num_heads: int, window: Optional[int] = None,
                 share: bool = True, window_only: bool = False):
        self.kv, self.table, self.window = kv_cache, page_table, window
        self.share = share and window is None
        self.window_only = window_only   # every layer it serves is windowed: no whole-context rows
        _, _, self.page_size, self.kv_heads, head_dim = kv_cache.k.shape
        self.query_group = num_heads // self.kv_heads   # query heads per KV head
        self.scale = head_dim ** -0.5
        self.device = page_table.device
        # (pages of each shared prefix, their gathered K/V by layer) of the previous step, if it had any
        self._kept_prefixes: tuple[tuple, dict] | None = None

    def prepare(self, decodes: list[DecodeSeq]) -> Optional[TorchDecodeMetadata]:
        if not decodes:
            self._kept_prefixes = None
            return None
        if self.window_only:
            return TorchDecodeMetadata(None, None, None, None, self._window_rows(decodes))
        groups = shared_prefix_groups(decodes, self.page_size) if self.share else []
        shared_pages = [0] * len(decodes)
        for members, n in groups:
            for i in members:
                shared_pages[i] = n
        kv_rows, bias = self._decode_rows(decodes, shared_pages)
        shared = self._shared_prefixes(decodes, groups) if groups else None
        if shared is None:
            self._kept_prefixes = None
        window = self._window_rows(decodes) if self.window is not None else None
        return TorchDecodeMetadata(kv_rows, bias, value_bags(kv_rows, self.query_group), shared, window)

    def forward(self, layer: int, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                meta: TorchDecodeMetadata, window: Optional[int] = None,
                sinks: Optional[torch.Tensor] = None) -> torch.Tensor:
        assert window in (None, self.window), "one sliding window size per model"
        rows, bias, bags = (meta.kv_rows, meta.bias, meta.value_bags) if window is None else meta.window
        return decode_attention(q, k_cache, v_cache, rows, bias, self.scale, meta.shared, bags, layer, sinks)

    def _window_rows(self, decodes: list[DecodeSeq]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Each decode's last `window` positions: its pages from the one the window starts on (a
        long context reads a window's worth, not all of it), masked before the window's start."""
        p, dev = self.page_size, self.device
        starts = [max(0, d.context_len - self.window) for d in decodes]
        skip = [start // p for start in starts]
        rows, bias = self._decode_rows(decodes, skip)
        before = torch.tensor([start - n * p for start, n in zip(starts, skip)], device=dev)
        outside = torch.arange(bias.shape[-1], device=dev) < before.unsqueeze(1)
        return rows, bias.masked_fill(outside[:, None, None, :], float("-inf")), value_bags(rows, self.query_group)

    def _decode_rows(self, decodes: list[DecodeSeq], shared_pages: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """kv_rows and attention bias of each decode's context past its first `shared_pages` pages."""
        p, dev = self.page_size, self.device
        own_lens = [d.context_len - n * p for d, n in zip(decodes, shared_pages)]
        n_pages = -(-max(own_lens) // p)   # from the host lists: no device read-back
        skip = torch.tensor(shared_pages, device=dev)
        page_rows = torch.tensor([d.page_row for d in decodes], device=dev)
        columns = (skip.unsqueeze(1) + torch.arange(n_pages, device=dev)).clamp_(max=self.table.shape[1] - 1)
        return self._rows_and_bias(self.table[page_rows.unsqueeze(1), columns], torch.tensor(own_lens, device=dev))

    def _rows_and_bias(self, pages: torch.Tensor, lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`decode_kv_rows` and `attention_bias` of contexts of `lens` tokens on `pages` [N, n]."""
        p, dev = self.page_size, self.device
        n_pages = pages.shape[1]
        # pages past a context's end read the zeroed padding page, never a stale one
        page_used = torch.arange(n_pages, device=dev) * p < lens.unsqueeze(1)
        pages = pages.masked_fill(~page_used, self.kv.pad_page)
        attend = (torch.arange(n_pages * p, device=dev) < lens.unsqueeze(1))[:, None, None, :]
        return decode_kv_rows(pages, p, self.kv_heads), attention_bias(attend)

    def _shared_prefixes(self, decodes: list[DecodeSeq], groups: list[tuple[list[int], int]]) -> SharedPrefixes:
        p, dev = self.page_size, self.device
        n_pages = max(n for _, n in groups)
        first = torch.tensor([decodes[members[0]].page_row for members, _ in groups], device=dev)
        kv_rows, bias = self._rows_and_bias(self.table[first, :n_pages],
                                            torch.tensor([n * p for _, n in groups], device=dev))
        # Last step's gathered K/V are still right if its prefixes were these same pages: a decode's
        # shared pages were locked since before last step's forward (its first step was a prefill),
        # so none was freed and rewritten in between. Any step without prefixes drops them.
        key = tuple(tuple(decodes[members[0]].pages[:n]) for members, n in groups)
        kept = self._kept_prefixes
        k = self.kv.k
        size = 2 * k.shape[0] * kv_rows.numel() * k.shape[-1] * k.element_size()
        layer_kv = None  # too large to hold for every layer: each layer gathers and drops its own
        if size <= MAX_KEPT_PREFIX_BYTES:
            layer_kv = kept[1] if kept is not None and kept[0] == key else {}
        self._kept_prefixes = None if layer_kv is None else (key, layer_kv)
        return SharedPrefixes.of_groups(kv_rows, bias, [members for members, _ in groups], len(decodes),
                                        self.query_group, layer_kv=layer_kv)


class HostAttentionBackend:
    """The torch extend path plus a decode path, and the K/V writer that goes with the latter."""
    graphs = None   # CUDA graphs need device-side metadata: none here

    def __init__(self, kv_cache: KVCache, page_table: torch.Tensor, num_heads: int, decodes: DecodePath,
                 write: Callable[..., None] = write_kv, paged_decode: Optional[Callable[[Any], Any]] = None,
                 window: Optional[int] = None, share: bool = True):
        self.kv = kv_cache
        self.extends = TorchExtends(kv_cache, page_table, num_heads, window, share)
        self.decodes = decodes
        self._write = write
        # the whole-layer CPU kernels' view of a pure-decode step's metadata (runtime/attention_cpu.py)
        self.paged_decode = paged_decode

    def prepare(self, layout: BatchLayout) -> HostAttentionMetadata:
        meta = HostAttentionMetadata(layout.num_decode, self.decodes.prepare(layout.decodes))
        self.extends.prepare(layout.extends, meta)
        return meta

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                batch: ForwardBatch, window: Optional[int] = None,
                sinks: Optional[torch.Tensor] = None) -> torch.Tensor:
        meta: HostAttentionMetadata = batch.attention
        k_cache, v_cache = self.kv.k[layer], self.kv.v[layer]
        self._write(k_cache, v_cache, batch.out_slots, k, v)
        nd = meta.num_decode
        if nd == q.shape[0]:
            return self.decodes.forward(layer, q, k_cache, v_cache, meta.decodes, window, sinks)
        out = torch.empty_like(q)
        if nd:
            out[:nd] = self.decodes.forward(layer, q[:nd], k_cache, v_cache, meta.decodes, window, sinks)
        self.extends.forward(q, k, v, k_cache, v_cache, meta, out, window, sinks)
        return out


def torch_attention_backend(kv_cache: KVCache, page_table: torch.Tensor, num_heads: int,
                            window: Optional[int] = None, sinks: bool = False,
                            window_only: bool = False) -> HostAttentionBackend:
    """`window`: the sliding window of the model's windowed layers (one size per model), if any;
    `sinks`: the model's layers have attention sinks. Either turns off attending shared prefixes
    once for a group, whose calls take neither. `window_only`: every layer it serves is windowed."""
    share = window is None and not sinks
    return HostAttentionBackend(kv_cache, page_table, num_heads,
                                TorchDecodes(kv_cache, page_table, num_heads, window, share, window_only),
                                window=window, share=share)
