"""The prefix cache's disk tier (`--cache-dir`): KV pages between the pool and a PageStore.

A page is written when it enters the radix tree, so a prompt's KV is on disk moments after its
prefill and survives a restart or a SIGKILL; a page whose write was dropped (the queue was full) is
offered again when the tree evicts it. Only copying a page out of the pool runs on the loop thread;
checksums and file I/O run on the store's threads.

A page on disk holds every layer's K/V in model order, wherever the pool keeps them (a model with
sliding-window layers keeps theirs in window pages): a page that gave its window page back is not
written, and a page read back takes a window page only where the prefix's end needs one.

A request whose prompt continues, past what the tree holds, into pages on disk waits (like one whose
grammar compiles) while the reader thread reads and checks them, then is queued; on admission the
KV manager copies them into pool pages and the tree, and the request starts with them cached.
"""
from __future__ import annotations

import hashlib
import logging
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from radixserve.radix import WindowPages
from radixserve.radix.page_store import PageRead, PageStore, PageWrite
from radixserve.radix.prefix_hash import page_hashes, root_hash
from radixserve.radix.window_pages import NONE
from radixserve.runtime.kv_cache import KVLayers
from radixserve.runtime.request import Request

log = logging.getLogger("radixserve.cache_dir")

RETENTION_SECONDS = {"in_memory": 0.0, "24h": 24 * 3600.0}
RETENTIONS = tuple(RETENTION_SECONDS)   # `prompt_cache_retention` values, the first kept without a disk tier
# host memory that pages read ahead for waiting requests may take at once, from the read until the
# request is admitted (or ends); a request beyond it is queued without them (and recomputes)
MAX_READ_AHEAD_BYTES = 1 << 30
# bytes of a tensor hashed in full; beyond, 16 windows of 64 KiB spread over it (an 8B model's key
# then costs ~0.3 GB of reads, not 16)
_FULL_HASH_BYTES = 1 << 20
_WINDOW = 64 << 10


@dataclass(frozen=True)
class DiskLoad:
    """Pages read for a waiting request: `reads[i]` is its page `first + i`."""
    first: int
    reads: list[PageRead]
    size: int   # host bytes they take until `DiskTier.release`


def cache_key(weights: dict, tokenizer, model_config, dtype: torch.dtype, page_size: int) -> bytes:
    """16 bytes naming everything a page's KV depends on: the weights (names, shapes, types and
    bytes), the tokenizer and chat template, the model config, the KV dtype and the page size."""
    h = hashlib.blake2b(digest_size=16, person=b"radixserve-kv")
    h.update(repr((str(dtype), page_size, repr(model_config))).encode())
    h.update(tokenizer.tok.to_str().encode())
    h.update((tokenizer.chat_template or "").encode())
    for name in sorted(weights):
        w = weights[name]
        if isinstance(w, torch.Tensor):
            data = w.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
            h.update(repr((name, str(w.dtype), tuple(w.shape))).encode())
        else:   # a BlockTensor: the file's bytes and its row order
            data = np.ascontiguousarray(w.data).reshape(-1)
            h.update(repr((name, w.kind, w.cols, w.data.shape)).encode())
            if w.row_map is not None:
                h.update(w.row_map.tobytes())
        _hash_bytes(h, data)
    return h.digest()


def _hash_bytes(h, data: np.ndarray) -> None:
    if data.nbytes <= _FULL_HASH_BYTES:
        h.update(memoryview(data))
        return
    for start in np.linspace(0, data.nbytes - _WINDOW, 16).astype(np.int64):
        h.update(memoryview(data[start:start + _WINDOW]))


class DiskTier:
    def __init__(self, store: PageStore, kv: KVLayers, page_size: int, windows: Optional[WindowPages] = None):
        self.store, self.kv, self.page_size, self.windows = store, kv, page_size, windows
        device = kv.full.k.device
        # model layer i's K/V in torch.cat((full, windowed)) of the two caches' layers
        n_full = kv.full.k.shape[0]
        self._order = torch.tensor([i if not w else n_full + i for w, i in kv.groups], device=device)
        self._full_layers = torch.tensor([j for j, (w, _) in enumerate(kv.groups) if not w], device=device)
        self._window_layers = torch.tensor([j for j, (w, _) in enumerate(kv.groups) if w], device=device)
        self._loading: deque[tuple[Request, Future, int, int]] = deque()   # (req, future, first page, bytes)
        self._read_ahead_bytes = 0   # of the loads being read and those read but not yet released

    @staticmethod
    def page_bytes(kv: KVLayers) -> int:
        """One page's K and V, every layer."""
        caches = [c.k for c in (kv.full, kv.windowed) if c is not None]
        return sum(2 * k[:, 0].numel() * k.element_size() for k in caches)

    # ---- writing (loop thread) -----------------------------------------------------------------
    def persist(self, hashes: list[int], tokens: list[int], pages: list[int], salt: Optional[str],
                retain_until: float = 0.0) -> None:
        """Store the pages not on disk yet (`tokens`: theirs, page after page); extend the retention
        of those that are. Never waits: a full queue drops the write."""
        p, store = self.page_size, self.store
        new = []
        for i, h in enumerate(hashes):
            if not store.has(h):
                # a page whose window layers' K/V are gone cannot be written whole
                if self.windows is None or self.windows.of(pages[i]) != NONE:
                    new.append(i)
            elif retain_until and store.retention(h) < retain_until:
                store.retain(h, retain_until)
        if not new:
            return
        host = self._copy_out([pages[i] for i in new])
        tenant = root_hash(salt)
        store.write([PageWrite(hashes[i], tenant, tokens[i * p:(i + 1) * p], host[j], retain_until)
                     for j, i in enumerate(new)])

    def _copy_out(self, pages: list[int]) -> list[np.ndarray]:
        full = self.kv.full
        idx = torch.tensor(pages, dtype=torch.long, device=full.k.device)
        k, v = full.k.index_select(1, idx), full.v.index_select(1, idx)
        if self.windows is not None:
            w, widx = self.kv.windowed, torch.from_numpy(self.windows.host_map()[pages]).to(full.k.device)
            k = torch.cat((k, w.k.index_select(1, widx))).index_select(0, self._order)
            v = torch.cat((v, w.v.index_select(1, widx))).index_select(0, self._order)
        both = torch.stack((k, v), dim=1).transpose(0, 2).cpu().contiguous()   # [pages, 2, layers, ...]
        flat = both.reshape(len(pages), -1).view(torch.uint8).numpy()
        return list(flat)

    def copy_in(self, pages: list[int], reads: list[PageRead], window_only: bool = False) -> None:
        """Write pages read from disk into pool pages `pages` (and into their window pages, those
        that have one); `window_only`: into their window pages alone (the rest is in the pool)."""
        k, v = self.kv.full.k, self.kv.full.v
        shape = (2, len(self.kv.groups)) + tuple(k[0, 0].shape)
        for page, read in zip(pages, reads):
            src = torch.frombuffer(read.payload, dtype=torch.uint8).view(k.dtype).view(shape).to(k.device)
            if self.windows is None:
                k[:, page], v[:, page] = src[0], src[1]
                continue
            if not window_only:
                k[:, page], v[:, page] = src[0, self._full_layers], src[1, self._full_layers]
            w = self.windows.of(page)
            if w != NONE:
                self.kv.windowed.k[:, w] = src[0, self._window_layers]
                self.kv.windowed.v[:, w] = src[1, self._window_layers]

    # ---- reading ahead (loop thread) ------------------------------------------------------------
    @property
    def pending(self) -> bool:
        return bool(self._loading)

    @property
    def read_ahead_bytes(self) -> int:
        return self._read_ahead_bytes

    def read_ahead(self, req: Request, held: int, max_pages: int) -> bool:
        """Start reading the pages of `req`'s prompt on disk from page `held` on (where the tree's
        prefix ends, or its window: KVManager.disk_read_start); whether it did (the request then
        waits for `poll`)."""
        p, salt = self.page_size, req.params.cache_salt
        limit = req.num_tokens - 1   # the last prompt token is always computed: its logits sample
        tokens = req.token_ids[: limit - limit % p]
        if held >= len(tokens) // p:
            return False
        hashes = page_hashes(tokens, p, root_hash(salt))
        end = held
        while end < len(hashes) and end - held < max_pages and self.store.stored(hashes[end]):
            end += 1
        size = (end - held) * self.store.file_bytes
        if end == held or self._read_ahead_bytes + size > MAX_READ_AHEAD_BYTES:
            return False
        future = self.store.read(hashes[held:end], [tokens[i * p:(i + 1) * p] for i in range(held, end)],
                                 root_hash(salt))
        self._loading.append((req, future, held, size))
        self._read_ahead_bytes += size
        return True

    def poll(self) -> list[Request]:
        """Waiting requests whose reads are done, oldest first, each with its `disk_load` set."""
        ready = []
        while self._loading and self._loading[0][1].done():
            req, future, first, size = self._loading.popleft()
            try:
                reads = future.result()
            except Exception:   # the request recomputes what it could not read
                log.exception("cache dir: reading %s's pages failed", req.request_id)
                reads = []
            if reads and not req.is_finished:
                req.disk_load = DiskLoad(first, reads, size)
            else:
                self._read_ahead_bytes -= size
            ready.append(req)
        return ready

    def release(self, load: DiskLoad) -> None:
        """The request admitted with `load`, or ended before: its bytes no longer count."""
        self._read_ahead_bytes -= load.size

    def close(self) -> None:
        self.store.close()


def retain_until(retention: Optional[str]) -> float:
    """The unix time before which a request's pages stay on disk whatever the LRU (0: none)."""
    seconds = RETENTION_SECONDS.get(retention or "in_memory", 0.0)
    return float(int(time.time() + seconds)) if seconds else 0.0   # whole seconds, as page files keep it
