"""A request's view of the KV cache: prefix matching, page allocation, caching and release.

The only place that moves pages between the pool, the radix tree and requests,
so the accounting invariant (free + tree + held == total) has one owner: the tree
never frees, it returns the pages it drops or declines and they are freed here.
"""
from __future__ import annotations

from typing import Optional

from radixserve.radix import KVPagePool, RadixCache, RequestPageTable
from radixserve.radix.page_pool import OutOfPagesError
from radixserve.radix.prefix_hash import root_hash
from radixserve.runtime.disk_tier import DiskLoad, DiskTier, retain_until
from radixserve.runtime.request import Request


class KVManager:
    def __init__(self, pool: KVPagePool, page_table: RequestPageTable, radix_enabled: bool = True,
                 disk: Optional[DiskTier] = None):
        self.pool = pool
        self.page_size = pool.page_size
        self.tree = RadixCache(pool.page_size)
        self.table = page_table
        self.radix_enabled = radix_enabled
        self.disk = disk if radix_enabled else None   # the tree's lower tier (`--cache-dir`)
        self.evicted_tokens = 0            # cached tokens dropped from the tree to make room

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
        if not running and self.tree.protected_size:
            # a lock nobody will release: those pages could never be evicted again
            raise AssertionError(f"KV page accounting broken: {self.tree.protected_size} tree tokens "
                                 f"still locked with no request running")

    def pages_needed(self, req: Request, new_tokens: int) -> int:
        return -(-(req.kv_len + new_tokens) // self.page_size) - len(req.pages)

    # ---- lifecycle -------------------------------------------------------
    def match(self, req: Request) -> int:
        """Attach the longest cached prefix to a request about to run; returns its length."""
        req.page_row = self.table.alloc_row()
        if not self.radix_enabled:
            return 0
        # leave at least one token to compute: its logits give the next token
        pages, node = self.tree.match_prefix(req.token_ids[: req.num_tokens - 1], req.params.cache_salt)
        self.tree.lock(node)
        load, req.disk_load = req.disk_load, None
        if load is not None:
            pages, node = self._read_back(req, pages, node, load)
        self.tree.record_hit(node)
        n = len(pages) * self.page_size
        req.tree_node, req.tree_len, req.kv_len, req.pages = node, n, n, pages
        self.table.write(req.page_row, 0, pages)
        return n

    def _read_back(self, req: Request, pages: list[int], node, load: DiskLoad):
        """Extend the tree's prefix `pages` (ending at the locked `node`) with the pages read from disk
        that follow it, as far as the pool allows; the new path is returned locked instead."""
        self.disk.release(load)
        p, start = self.page_size, len(pages)
        reads = load.reads[start - load.first:] if load.first <= start else []
        k = min(len(reads), self.available_pages())
        if k == 0:
            return pages, node
        self._make_free(k)
        new = self.pool.alloc(k)
        self.disk.copy_in(new, reads[:k])
        tokens, salt = req.token_ids[:(start + k) * p], req.params.cache_salt
        self.pool.free(self.tree.insert(tokens, pages + new, salt).duplicates)
        pages, deeper = self.tree.match_prefix(tokens, salt)
        self.tree.lock(deeper)
        self.tree.unlock(node)
        req.disk_hit_tokens = k * p
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
        self.pool.free(dropped)
        self.evicted_tokens += len(dropped) * self.page_size

    def alloc(self, req: Request, new_tokens: int) -> bool:
        """Give `req` pages for `new_tokens` more positions, evicting tree leaves if needed."""
        n = self.pages_needed(req, new_tokens)
        if n <= 0:
            return True
        self._make_free(n)
        try:
            pages = self.pool.alloc(n)
        except OutOfPagesError:
            return False
        self.table.write(req.page_row, len(req.pages), pages)
        req.pages.extend(pages)
        return True

    def advance(self, req: Request, n: int, cache: bool) -> None:
        """A step computed `n` more positions of `req`; with `cache` (a prefill chunk) its whole
        pages enter the tree at once, so later requests reuse a prompt mid-prefill."""
        req.kv_len += n
        if cache:
            self.cache_prefix(req)

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
        self.pool.free(self.tree.insert(req.token_ids[:n], req.pages[:k], salt).duplicates)
        tree_pages, node = self.tree.match_prefix(req.token_ids[:n], salt)
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
        self.pool.free(req.pages[req.tree_len // self.page_size:])
        if req.tree_node is not None:
            self.tree.unlock(req.tree_node)
        self.table.free_row(req.page_row)
        req.pages, req.tree_node, req.tree_len, req.kv_len, req.page_row = [], None, 0, 0, -1

    def drop_unused(self, salt: Optional[str] = None, every_salt: bool = True) -> int:
        """Drop the cached prefixes no request holds (all, or one salt's); returns the tokens dropped."""
        pages = self.tree.drop_unused(salt, every_salt)
        self.pool.free(pages)
        if self.disk is not None:
            self.disk.store.drop(None if every_salt else root_hash(salt))
        return len(pages) * self.page_size

    def flush(self) -> None:
        """Drop all cached prefixes (only when no request holds any)."""
        self.pool.free(self.tree.reset())
