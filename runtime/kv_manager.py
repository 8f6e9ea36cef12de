"""A request's view of the KV cache: prefix matching, page allocation, caching and release.

The only place that moves pages between the pool, the radix tree and requests,
so the accounting invariant (free + tree + held == total) has one owner: the tree
never frees, it returns the pages it drops or declines and they are freed here.

A model with sliding-window layers keeps their K/V in window pages (radix/window_pages.py), one
per KV page at most. A request's own pages give theirs back once its window has passed them; a
cached page keeps its own until the window pool runs short, then the least recently used ones
that no running request's window reaches give theirs back (tombstones: the global layers' K/V
stay and still serve hits). A prefix is reused only as far as the window pages just before its
end are all there, so a hit gives the same output as no hit.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from radixserve.radix import KVPagePool, RadixCache, RequestPageTable, WindowPages
from radixserve.radix.page_pool import OutOfPagesError
from radixserve.radix.prefix_hash import root_hash
from radixserve.radix.window_pages import NONE
from radixserve.runtime.disk_tier import DiskLoad, DiskTier, retain_until
from radixserve.runtime.request import Request


class KVManager:
    def __init__(self, pool: KVPagePool, page_table: RequestPageTable, radix_enabled: bool = True,
                 disk: Optional[DiskTier] = None, windows: Optional[WindowPages] = None, window: int = 0):
        self.pool = pool
        self.page_size = pool.page_size
        self.tree = RadixCache(pool.page_size)
        self.table = page_table
        self.radix_enabled = radix_enabled
        self.disk = disk if radix_enabled else None   # the tree's lower tier (`--cache-dir`)
        self.evicted_tokens = 0            # cached tokens dropped from the tree to make room
        self.windows, self.window = windows, window   # the sliding-window layers' pages, and their window
        self._active: dict[int, Request] = {}        # requests holding pages, by page-table row

    # ---- accounting ------------------------------------------------------
    def available_pages(self) -> int:
        """Pages that could be handed out now: free plus evictable from the tree."""
        return self.pool.num_free + self.tree.evictable_size // self.page_size

    @property
    def pages_free(self) -> int:
        return self.pool.num_free

    @property
    def pages_cached(self) -> int:
        """Pages owned by the radix tree (some of them also read by running requests)."""
        return self.tree.num_pages

    @property
    def pages_used(self) -> int:
        """Pages held by running requests outside the tree (read from other threads: never negative)."""
        return max(0, self.pool.num_pages - self.pool.num_free - self.tree.num_pages)

    def check_invariant(self, running: list[Request]) -> None:
        held = sum(len(r.pages) - r.tree_len // self.page_size for r in running)
        total = self.pool.num_free + self.tree.num_pages + held
        if total != self.pool.num_pages:
            raise AssertionError(f"KV page accounting broken: free {self.pool.num_free} + tree "
                                 f"{self.tree.num_pages} + held {held} != {self.pool.num_pages}")
        if self.windows is not None:
            self._check_windows(running)
        if not running and self.tree.protected_size:
            # a lock nobody will release: those pages could never be evicted again
            raise AssertionError(f"KV page accounting broken: {self.tree.protected_size} tree tokens "
                                 f"still locked with no request running")

    def _check_windows(self, running: list[Request]) -> None:
        attached = self.windows.attached()
        if len(attached) + self.windows.num_free != self.windows.num_pages:
            raise AssertionError(f"window page accounting broken: {len(attached)} attached + "
                                 f"{self.windows.num_free} free != {self.windows.num_pages}")
        if np.any(self.pool.is_free(attached)):
            raise AssertionError("a free KV page still has a window page")
        for r in running:
            reach = r.pages[self._window_start(r.kv_len):]
            if reach and not np.all(self.windows.has(reach)):
                raise AssertionError(f"request {r.request_id}: a page its window reaches has no window page")

    def _window_start(self, kv_len: int) -> int:
        """The first page the window of a request with `kv_len` computed positions still reads: its
        next token, at position kv_len, sees positions kv_len - window + 1 onwards (counted here
        from one position earlier)."""
        return max(0, kv_len - self.window) // self.page_size

    def pages_needed(self, req: Request, new_tokens: int) -> int:
        return -(-(req.kv_len + new_tokens) // self.page_size) - len(req.pages)

    # ---- lifecycle -------------------------------------------------------
    def match(self, req: Request) -> int:
        """Attach the longest cached prefix to a request about to run; returns its length."""
        req.page_row = self.table.alloc_row()
        if self.windows is not None:
            self._active[req.page_row] = req
        if not self.radix_enabled:
            return 0
        # leave at least one token to compute: its logits give the next token
        pages, node = self.tree.match_prefix(req.token_ids[: req.num_tokens - 1], req.params.cache_salt)
        self.tree.lock(node)
        load, req.disk_load = req.disk_load, None
        usable = len(pages) if self.windows is None else self._usable(pages)
        if load is not None:
            pages, node = self._read_back(req, pages, node, load)
        if self.windows is not None:
            pages, node = self._window_usable(req, pages, node)
        if load is not None:   # what the tree alone could not have given
            req.disk_hit_tokens = max(0, len(pages) - usable) * self.page_size
        # a request matched again (after admission failed) keeps its count only as far as it holds
        req.disk_hit_tokens = min(req.disk_hit_tokens, len(pages) * self.page_size)
        self.tree.record_hit(node)
        n = len(pages) * self.page_size
        req.tree_node, req.tree_len, req.kv_len, req.pages = node, n, n, pages
        self.table.write(req.page_row, 0, pages)
        return n

    def disk_read_start(self, req: Request) -> int:
        """The page of `req`'s prompt the disk tier reads on from: where the tree's prefix ends, or,
        where that prefix's window lacks window pages, where its window starts (`_read_back` fills
        them again from their copies on disk). Read only: nothing is split, locked or refreshed."""
        tokens = req.token_ids[: req.num_tokens - 1]
        if self.windows is None:
            return self.tree.match_length(tokens, len(tokens), req.params.cache_salt)[0] // self.page_size
        pages = self.tree.prefix_pages(tokens, req.params.cache_salt)
        m = len(pages)
        return m if self._usable(pages) == m else self._window_start(m * self.page_size)

    def _usable(self, pages: list[int]) -> int:
        """How many of `pages` (a prefix) can be reused: as many as end with all the window pages
        their last window reads. missing[j] counts the pages without one among the first j."""
        missing = np.concatenate(([0], np.cumsum(~self.windows.has(pages))))
        ends = np.arange(len(pages) + 1)
        starts = np.maximum(ends * self.page_size - self.window, 0) // self.page_size
        return int(np.flatnonzero(missing[ends] == missing[starts])[-1])

    def _window_usable(self, req: Request, pages: list[int], node):
        """The longest part of the locked prefix `pages` (ending at `node`) whose last window has
        all its window pages, returned locked instead."""
        n = self._usable(pages)
        if n == len(pages):
            return pages, node
        pages, shorter = self.tree.match_prefix(req.token_ids[:n * self.page_size], req.params.cache_salt)
        self.tree.lock(shorter)
        self.tree.unlock(node)
        return pages, shorter

    def _read_back(self, req: Request, pages: list[int], node, load: DiskLoad):
        """Extend the tree's prefix `pages` (ending at the locked `node`) with the pages read from disk
        that follow it, as far as the pool allows; the new path is returned locked instead. With
        window pages, the reads may start inside `pages` (where their window pages had been given
        back): those the prefix's new end needs take theirs again, filled from disk."""
        self.disk.release(load)
        p, start, read_end = self.page_size, len(pages), load.first + len(load.reads)
        reads = load.reads[start - load.first:] if load.first <= start else []
        k = min(len(reads), self.available_pages())
        self._make_free(k)
        new = self.pool.alloc(k)
        if self.windows is not None:   # the window pages the prefix's end needs, where they can be had
            end = start + k if read_end >= start else read_end   # reads that stop short: a shorter end
            first = self._window_start(end * p)
            again = [i for i in range(first, min(end, start)) if self.windows.of(pages[i]) == NONE]
            reach = [pages[i] for i in again] + new[max(0, first - start):]
            # none for an end whose window would still lack some; the prefix's own are not taken
            own = {q for q in pages if self.windows.of(q) != NONE}
            if reach and end > self._usable(pages) and all(load.first <= i < read_end for i in again) and \
                    self._make_window_free(len(reach), self._window_reached() | own):
                self.windows.attach(reach)
                self.disk.copy_in([pages[i] for i in again], [load.reads[i - load.first] for i in again],
                                  window_only=True)
        if k == 0:
            return pages, node
        self.disk.copy_in(new, reads[:k])
        tokens, salt = req.token_ids[:(start + k) * p], req.params.cache_salt
        self._free(self.tree.insert(tokens, pages + new, salt).duplicates)
        pages, deeper = self.tree.match_prefix(tokens, salt)
        self.tree.lock(deeper)
        self.tree.unlock(node)
        return pages, deeper

    def _make_free(self, n: int) -> None:
        """Evict tree leaves (LRU) until `n` pages are free, if they can be; with a disk tier, what
        is not on disk yet is offered to it first."""
        short = n - self.pool.num_free
        if short <= 0:
            return
        if self.disk is None:
            dropped = self.tree.evict(short * self.page_size)
        else:
            dropped = []
            for leaf in self.tree.evict_leaves(short * self.page_size, hashed=True):
                self.disk.persist(leaf.hashes, leaf.key, leaf.pages, leaf.salt)
                dropped.extend(leaf.pages)
        self._free(dropped)
        self.evicted_tokens += len(dropped) * self.page_size

    def _window_reached(self) -> set[int]:
        reached = set()
        for r in self._active.values():
            reached.update(r.pages[self._window_start(r.kv_len):])
        return reached

    def _window_room(self, n: int, reached: set[int]) -> bool:
        """Whether `n` window pages could be had: every page a window reaches holds one, and only the
        rest can be taken (so a request that cannot be admitted does not walk the tree every step)."""
        return self.windows.num_pages - len(reached) >= n

    def _make_window_free(self, n: int, reached: Optional[set[int]] = None) -> bool:
        """Have `n` window pages free, taking them from the least recently used cached pages outside
        `reached` (by default: what running requests' windows read); False (and nothing taken) if
        there are not that many. A pass walks the whole tree, so it takes at least 1/16 of the pool."""
        short = n - self.windows.num_free
        if short <= 0:
            return True
        reached = self._window_reached() if reached is None else reached
        if not self._window_room(n, reached):
            return False
        cached = [q for q in self.tree.pages_oldest_first() if q not in reached]
        cached = [q for q, has in zip(cached, self.windows.has(cached)) if has]
        if len(cached) < short:
            return False
        self.windows.detach(cached[:max(short, self.windows.num_pages // 16)])
        return True

    def _free(self, pages: list[int]) -> None:
        if self.windows is not None:
            self.windows.detach(pages)
        self.pool.free(pages)

    def alloc(self, req: Request, new_tokens: int, spare: int = 0) -> bool:
        """Give `req` pages for `new_tokens` more positions, evicting tree leaves if needed; with
        window pages, `spare` more of them must stay free (the running decodes' next pages)."""
        n = self.pages_needed(req, new_tokens)
        if n <= 0:
            return True
        # nothing is evicted or given back for an allocation that cannot succeed
        reached = None   # what running windows read: found once, and only when window pages run short
        if self.windows is not None and self.windows.num_free < n + spare:
            reached = self._window_reached()
            if not self._window_room(n + spare, reached):
                return False
        if n > self.available_pages():
            return False
        self._make_free(n)
        if self.windows is not None and not self._make_window_free(n + spare, reached):
            return False
        try:
            pages = self.pool.alloc(n)
        except OutOfPagesError:
            return False
        if self.windows is not None:
            self.windows.attach(pages)
        self.table.write(req.page_row, len(req.pages), pages)
        req.pages.extend(pages)
        return True

    def advance(self, req: Request, n: int, cache: bool) -> None:
        """A step computed `n` more positions of `req`; with `cache` (a prefill chunk) its whole
        pages enter the tree at once, so later requests reuse a prompt mid-prefill."""
        req.kv_len += n
        if cache:   # first: pages cached keep their window pages (the next hit's window may need them)
            self.cache_prefix(req)
        if self.windows is not None:   # its own pages its window has passed
            start, end = max(req.window_trimmed, req.tree_len // self.page_size), self._window_start(req.kv_len)
            if end > start:
                self.windows.detach(req.pages[start:end])
                req.window_trimmed = end

    def cache_prefix(self, req: Request) -> None:
        """Insert the request's computed whole pages into the tree and hold them through it."""
        if not self.radix_enabled:
            return
        n = req.kv_len - req.kv_len % self.page_size
        if n <= req.tree_len:
            return
        k = n // self.page_size
        # pages another request cached first are copies: read the tree's instead
        salt = req.params.cache_salt
        duplicates = self.tree.insert(req.token_ids[:n], req.pages[:k], salt).duplicates
        tree_pages, node = self.tree.match_prefix(req.token_ids[:n], salt)
        if self.windows is not None:   # a cached page that gave its window page back takes this copy's
            for mine, theirs in zip(req.pages[:k], tree_pages):
                if mine != theirs and self.windows.of(theirs) == NONE and self.windows.of(mine) != NONE:
                    self.windows.move(mine, theirs)
        self._free(duplicates)
        if tree_pages != req.pages[:k]:
            req.pages[:k] = tree_pages
            self.table.write(req.page_row, 0, tree_pages)
        self.tree.lock(node)
        if req.tree_node is not None:
            self.tree.unlock(req.tree_node)
        if self.disk is not None:   # with a retention, every page of the prompt is (re)kept, not only new ones
            retain = retain_until(req.params.prompt_cache_retention)
            first = 0 if retain else req.tree_len // self.page_size
            self.disk.persist(self.tree.path_hashes(node)[first:k], req.token_ids[first * self.page_size:n],
                              req.pages[first:k], salt, retain)
        req.tree_node, req.tree_len = node, n

    def release(self, req: Request, cache: bool = True) -> None:
        """Return everything the request holds; with `cache`, its computed prefix stays in the tree."""
        if req.disk_load is not None:   # it ends before its pages read ahead were used
            self.disk.release(req.disk_load)
            req.disk_load = None
        if req.page_row < 0:
            return
        if cache:
            self.cache_prefix(req)
        self._free(req.pages[req.tree_len // self.page_size:])
        if req.tree_node is not None:
            self.tree.unlock(req.tree_node)
        self.table.free_row(req.page_row)
        self._active.pop(req.page_row, None)
        req.pages, req.tree_node, req.tree_len, req.kv_len, req.page_row = [], None, 0, 0, -1
        req.window_trimmed = 0

    def drop_unused(self, salt: Optional[str] = None, every_salt: bool = True) -> int:
        """Drop the cached prefixes no request holds (all, or one salt's); returns the tokens dropped."""
        pages = self.tree.drop_unused(salt, every_salt)
        self._free(pages)
        if self.disk is not None:
            self.disk.store.drop(None if every_salt else root_hash(salt))
        return len(pages) * self.page_size

    def flush(self) -> None:
        """Drop all cached prefixes (only when no request holds any)."""
        self._free(self.tree.reset())
