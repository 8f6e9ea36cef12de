"""Radix tree over token ids whose values are KV cache page ids.

Edges hold whole pages of tokens: with page size P, a key is matched and
stored in multiples of P, an unaligned tail is never cached, and a node keeps
one page id per P tokens of its key. `lock` pins a path so running requests
keep reading it.

The tree owns its pages logically but never frees them: it has no pool.
`insert` hands back the caller's duplicate pages, `evict` and `reset` hand back
the pages they drop, and KVManager frees them, so one place moves pages.
"""
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Optional

from radixserve.radix.prefix_hash import page_hashes, root_hash


@dataclass(eq=False)
class TreeNode:
    key: list[int] = field(default_factory=list)
    pages: list[int] = field(default_factory=list)   # len(key) // page_size ids
    parent: Optional["TreeNode"] = None
    children: dict = field(default_factory=dict)
    lock_ref: int = 0
    last_access: int = 0
    salt: Optional[str] = None   # the tenant (`cache_salt`) whose subtree this is; None: shared
    hits: int = 0   # requests whose reused prefix ended here (`record_hit`); a subtree's sum counts its path
    # chained hashes of the path's prefixes ending at each of this edge's pages, computed on first
    # summary; a split keeps them valid (a prefix's hash does not depend on where edges are cut)
    hashes: Optional[list[int]] = None

    @property
    def is_leaf(self) -> bool:
        return not self.children


def common_prefix_len(a: list[int], b: list[int], page_size: int) -> int:
    """Length of the common prefix of `a` and `b`, rounded down to whole pages.

    Slice comparisons run in C; a token-by-token Python loop made matching a queue of
    1,000-token prompts against the tree cost milliseconds per scheduling step.
    """
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n - n % page_size
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo - lo % page_size


@dataclass(frozen=True)
class CachedPrefix:
    """One cached prefix (a path from the root to a node), for the cache view."""
    tokens: int                 # its length
    hash: int                   # `prefix_hash` of it: the name a router knows it by (salted per tenant)
    hits: int                   # requests that reused at least this whole prefix
    in_use: bool                # a running request holds it (it cannot be evicted now)
    token_ids: Optional[list[int]] = None   # only when asked for (the prompt text is private)


@dataclass(frozen=True)
class InsertResult:
    present: int            # leading tokens that were already cached
    duplicates: list[int]   # the caller's pages the tree did not take: it has its own copy


class RadixCache:
    def __init__(self, page_size: int):
        if page_size < 1:
            raise ValueError("page_size must be >= 1")
        self.page_size = page_size
        self._clock = itertools.count(1)
        self._clear()

    def _clear(self) -> None:  # private: dropping nodes without handing back their pages leaks them
        self.root = TreeNode(lock_ref=1)  # the root is never evicted
        self.evictable_size = 0
        self.protected_size = 0
        self.num_nodes = 0
        # (last_access, tie, node) of leaves that may be evictable, pushed whenever a node becomes an
        # unlocked leaf or is used again as one; an entry is stale once its node changed since, and
        # is skipped when popped. Eviction then costs O(log n) a leaf, not a walk of the whole tree.
        self._leaves: list[tuple[int, int, TreeNode]] = []
        self._tie = itertools.count()

    def _offer(self, node: TreeNode) -> None:
        """`node` may have become an evictable leaf, or been used again as one."""
        if node.is_leaf and node.lock_ref == 0 and node is not self.root:
            heapq.heappush(self._leaves, (node.last_access, next(self._tie), node))
            if len(self._leaves) > 2 * self.num_nodes + 64:   # mostly stale: rebuild, amortised O(1)
                self._leaves = [e for e in self._leaves if self._current(e)]
                heapq.heapify(self._leaves)

    @staticmethod
    def _current(entry: tuple[int, int, TreeNode]) -> bool:
        access, _, node = entry
        return node.parent is not None and node.is_leaf and node.lock_ref == 0 and node.last_access == access

    # ---- queries -------------------------------------------------------
    @property
    def total_size(self) -> int:
        """Tokens held by the tree."""
        return self.evictable_size + self.protected_size

    @property
    def num_pages(self) -> int:
        return self.total_size // self.page_size

    def _child_key(self, tokens: list[int]):
        return tokens[0] if self.page_size == 1 else tuple(tokens[: self.page_size])

    def _key(self, node: TreeNode, tokens: list[int], salt: Optional[str]):
        """The key of `node`'s child on `tokens`: under the root a salted prompt's first page is keyed
        with its salt, so tenants' subtrees never meet (no salt: the shared tree, keyed as before)."""
        key = self._child_key(tokens)
        return (salt, key) if salt is not None and node is self.root else key

    def _key_of(self, node: TreeNode):
        return self._key(node.parent, node.key, node.salt)

    def match_prefix(self, tokens: list[int], salt: Optional[str] = None) -> tuple[list[int], TreeNode]:
        """Pages of the longest cached page-aligned prefix of `tokens` (in `salt`'s tree), and its last node."""
        tokens = tokens[: len(tokens) - len(tokens) % self.page_size]
        node, pages, now = self.root, [], next(self._clock)
        node.last_access = now
        while tokens:
            child = node.children.get(self._key(node, tokens, salt))
            if child is None:
                break
            child.last_access = now
            n = common_prefix_len(child.key, tokens, self.page_size)
            if n < len(child.key):
                child = self._split(child, n)
            pages.extend(child.pages)
            node = child
            tokens = tokens[n:]
        self._offer(node)   # its access time moved
        return pages, node

    def match_length(self, tokens: list[int], limit: int, salt: Optional[str] = None) -> tuple[int, TreeNode]:
        """Cached page-aligned prefix length of `tokens[:limit]` and the deepest node it reaches.

        A read-only `match_prefix` for ordering the waiting queue: it neither splits edges nor
        refreshes LRU times, so looking at the queue every step does not keep prefixes alive.
        The node may be one whose edge is matched only in part (the request's path enters it).
        """
        limit = min(limit, len(tokens))
        limit -= limit % self.page_size
        node, i = self.root, 0
        while i < limit:
            child = node.children.get(self._key(node, tokens[i:i + self.page_size], salt))
            if child is None:
                break
            n = common_prefix_len(child.key, tokens[i:min(i + len(child.key), limit)], self.page_size)
            node, i = child, i + n
            if n < len(child.key):
                break
        return i, node

    def prefix_pages(self, tokens: list[int], salt: Optional[str] = None) -> list[int]:
        """The pages `match_prefix` would return, read only (as `match_length`)."""
        n, node = self.match_length(tokens, len(tokens), salt)
        return self._along(node, lambda m: m.pages)[: n // self.page_size]

    def page_hash_summary(self, limit: int) -> tuple[list[int], bool]:
        """Hashes (`prefix_hash.page_hashes`) of the cached page-aligned prefixes, most recently
        used first, at most `limit` of them, and whether any were left out. Whole edges are taken
        in LRU order, and a node is never used more recently than its parent, so what is kept is
        (up to ties) closed under taking prefixes: a router matching a prompt page by page stops at
        the same place it would on the full set, or earlier. The cost is one hash per page the first
        time an edge is summarised, then a walk over the nodes."""
        walk, stack = [], [(c, 1) for c in self.root.children.values()]
        while stack:
            node, depth = stack.pop()
            walk.append((-node.last_access, depth, id(node), node))
            stack.extend((c, depth + 1) for c in node.children.values())
        walk.sort()
        out: list[int] = []
        for *_, node in walk:
            if len(out) + len(node.pages) > limit:
                return out, True
            out.extend(self._hashes(node))
        return out, False

    def top_prefixes(self, limit: int, by: str = "tokens", with_tokens: bool = False) -> list[CachedPrefix]:
        """The `limit` cached prefixes (one per node) with the most tokens, or (`by="hits"`) reused by
        the most requests, ties to the longer. One walk of the tree."""
        order, stack = [], [(c, len(c.key)) for c in self.root.children.values()]
        while stack:   # pre-order: every node after its parent
            node, length = stack.pop()
            order.append((node, length))
            stack.extend((c, length + len(c.key)) for c in node.children.values())
        reused = {}
        for node, _ in reversed(order):   # children first: subtree sums of hits
            reused[node] = node.hits + sum(reused[c] for c in node.children.values())
        if by not in ("tokens", "hits"):
            raise ValueError(f"by must be 'tokens' or 'hits', got {by!r}")
        rank = (lambda e: (e[1], reused[e[0]])) if by == "tokens" else (lambda e: (reused[e[0]], e[1]))
        return [CachedPrefix(length, self._hashes(node)[-1], reused[node], node.lock_ref > 0,
                             self._path(node) if with_tokens else None)
                for node, length in heapq.nlargest(limit, order, key=rank)]

    def _along(self, node: TreeNode, part) -> list:
        """`part(n)` of every node n from the root's child down to `node`, concatenated."""
        parts = []
        while node is not self.root:
            parts.append(part(node))
            node = node.parent
        return [x for items in reversed(parts) for x in items]

    def _path(self, node: TreeNode) -> list[int]:
        return self._along(node, lambda n: n.key)

    def path_hashes(self, node: TreeNode) -> list[int]:
        """The chained hash of every page on the path from the root to `node` (the disk tier's file names)."""
        return self._along(node, self._hashes)

    def _hashes(self, node: TreeNode) -> list[int]:
        if node.hashes is None:
            parent = node.parent
            start = root_hash(node.salt) if parent is self.root else self._hashes(parent)[-1]
            node.hashes = page_hashes(node.key, self.page_size, start)
        return node.hashes

    # ---- updates -------------------------------------------------------
    def insert(self, tokens: list[int], pages: list[int], salt: Optional[str] = None) -> InsertResult:
        """Cache the whole pages of `tokens`, one id in `pages` per page; the tree takes the new ones.

        Where a page is already cached under a different id, the caller's page is a
        duplicate: it is returned in `duplicates` for the caller to free, not taken.
        """
        p = self.page_size
        aligned = len(tokens) - len(tokens) % p
        if len(pages) != aligned // p:
            raise ValueError(f"{len(pages)} pages for {aligned // p} whole pages of tokens")
        tokens = tokens[:aligned]
        node, now, present = self.root, next(self._clock), 0
        node.last_access = now
        duplicates: list[int] = []
        while tokens:
            child = node.children.get(self._key(node, tokens, salt))
            if child is None:
                leaf = TreeNode(key=list(tokens), pages=list(pages), parent=node, last_access=now, salt=salt)
                node.children[self._key_of(leaf)] = leaf
                self.evictable_size += len(tokens)
                self.num_nodes += 1
                node = leaf
                break
            child.last_access = now
            n = common_prefix_len(child.key, tokens, p)
            if n < len(child.key):
                child = self._split(child, n)
            # equal ids are the caller reading the tree's own page, not a copy
            duplicates.extend(q for q, ours in zip(pages[: n // p], child.pages) if q != ours)
            present += n
            node = child
            tokens, pages = tokens[n:], pages[n // p:]
        self._offer(node)   # its access time moved
        return InsertResult(present, duplicates)

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Cut `child`'s edge after `n` tokens (whole pages); return the new upper node."""
        k = n // self.page_size
        parent = child.parent
        upper = TreeNode(key=child.key[:n], pages=child.pages[:k], parent=parent, salt=child.salt,
                         lock_ref=child.lock_ref, last_access=child.last_access,
                         hashes=None if child.hashes is None else child.hashes[:k])
        parent.children[self._key_of(upper)] = upper
        child.key, child.pages, child.parent = child.key[n:], child.pages[k:], upper
        child.hashes = None if child.hashes is None else child.hashes[k:]
        upper.children[self._child_key(child.key)] = child
        self.num_nodes += 1
        self._offer(child)   # callers touch `child` just before they split it
        return upper

    def record_hit(self, node: TreeNode) -> None:
        """A request reuses the prefix ending at `node` (what `match_prefix` returned)."""
        if node is not self.root:
            node.hits += 1

    def lock(self, node: TreeNode) -> None:
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable_size -= len(node.key)
                self.protected_size += len(node.key)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: TreeNode) -> None:
        while node is not self.root:
            if node.lock_ref <= 0:
                raise RuntimeError("unlock of an unlocked radix node")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.evictable_size += len(node.key)
                self.protected_size -= len(node.key)
                self._offer(node)
            node = node.parent

    def evict(self, n_tokens: int) -> list[int]:
        """Drop at least `n_tokens` (if possible) from LRU unlocked leaves; return their pages."""
        return [q for leaf in self.evict_leaves(n_tokens) for q in leaf.pages]

    def evict_leaves(self, n_tokens: int, hashed: bool = False) -> list[TreeNode]:
        """`evict`, returning the detached leaves (tokens, pages, salt; with `hashed`, their page
        hashes too: a lower tier keeps them by those)."""
        dropped: list[TreeNode] = []
        evicted = 0
        while self._leaves and evicted < n_tokens:
            entry = heapq.heappop(self._leaves)
            if not self._current(entry):
                continue
            leaf = entry[2]
            if hashed:
                self._hashes(leaf)
            dropped.append(leaf)
            evicted += len(leaf.key)
            self.evictable_size -= len(leaf.key)
            self.num_nodes -= 1
            parent = leaf.parent
            del parent.children[self._key_of(leaf)]
            if parent is not self.root:   # those requests reused the parent's prefix too
                parent.hits += leaf.hits
            leaf.parent = None   # detached: its stale heap entries are skipped
            self._offer(parent)
        return dropped

    def drop_unused(self, salt: Optional[str] = None, every_salt: bool = True) -> list[int]:
        """Drop every cached prefix no request holds, of all trees or only of `salt`'s (None: the
        shared one), and return their pages; prefixes in use stay."""
        order = list(self._nodes())   # pre-order: a node's children come after it
        dropped: list[int] = []
        for node in reversed(order):
            if node.children or node.lock_ref or not (every_salt or node.salt == salt):
                continue
            dropped.extend(node.pages)
            self.evictable_size -= len(node.key)
            self.num_nodes -= 1
            del node.parent.children[self._key_of(node)]
            node.parent = None   # detached: its heap entries are skipped
        return dropped

    def reset(self) -> list[int]:
        """Drop every cached prefix and return all its pages; no node may be locked."""
        if self.protected_size:
            raise RuntimeError("cannot reset the radix cache while requests hold prefixes")
        pages = [q for n in self._nodes() for q in n.pages]
        self._clear()
        return pages

    def pages_oldest_first(self) -> list[int]:
        """Every cached page: the least recently used nodes' first, each node's in position order."""
        return [q for n in sorted(self._nodes(), key=lambda n: n.last_access) for q in n.pages]

    def _nodes(self):
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())
