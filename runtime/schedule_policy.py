"""Waiting-queue order. A policy only orders; admission limits live in the scheduler.

`lpm` (longest cached prefix first, the default) and `dfs-weight` look the queue up in the
radix tree; `fcfs` and `priority` do not. The two cache-aware policies never starve a
request (see `_CacheAwarePolicy`).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Optional, Protocol, Sequence

from radixserve.radix import RadixCache, TreeNode
from radixserve.runtime.request import Request

# Beyond this many waiting requests the cache-aware policies keep queue order (SGLang uses 128
# too). Measured with bench/scheduler_overhead.py: ordering costs ~7 µs per waiting request
# with a 1,000-token cached prefix, so ~0.9 ms at 128 (~1% of a 70 ms decode step at batch
# 32) but ~7 ms at 1,000, and a queue that long drains over many steps anyway.
CACHE_AWARE_MAX_QUEUE = 128


@dataclass
class AdmissionOrder:
    requests: list[Request]
    # The first `strict` requests are admitted in exactly this order: when one does not fit,
    # admission stops there. Past them the order is a preference: a request that does not fit
    # is passed over (e.g. its cached prefix is pinned by nobody while the next one's is pinned
    # by the running batch, so the next one needs far fewer new pages).
    strict: int


class SchedulePolicy(Protocol):
    # hold a request back while a running one prefills the uncached prefix they share
    shares_prefixes: bool

    def order(self, waiting: Sequence[Request], tree: Optional[RadixCache]) -> AdmissionOrder:
        ...


def cached_len(tree: RadixCache, req: Request) -> int:
    """Tokens of `req` the tree could serve (at least one is always left to compute)."""
    return tree.match_length(req.token_ids, req.num_tokens - 1, req.params.cache_salt)[0]


class FCFSPolicy:
    shares_prefixes = False

    def order(self, waiting: Sequence[Request], tree: Optional[RadixCache]) -> AdmissionOrder:
        return AdmissionOrder(list(waiting), strict=len(waiting))


class PriorityPolicy:
    """Lower `priority` first; within a level, queue order (arrival, preempted requests in front)."""
    shares_prefixes = False

    def order(self, waiting: Sequence[Request], tree: Optional[RadixCache]) -> AdmissionOrder:
        return AdmissionOrder(sorted(waiting, key=lambda r: r.priority), strict=len(waiting))  # stable sort


@dataclass
class _CacheAwarePolicy:
    """Orders by what the tree holds, within a bounded window of unfairness.

    A request may be overtaken by requests that arrived up to `max_queue_wait_boost` seconds
    after it, never by later ones: as soon as the queue holds a request that arrived more than
    that after it, it jumps ahead in arrival order. So a cold request behind a stream of
    hot-prefix requests is admitted once it has waited the boost, while a burst that arrived
    together (an offline batch, an agent's fan-out) keeps its cache-aware order however long
    it takes to drain. Preempted requests go first of all: their streams are open mid-output.
    """
    max_queue_wait_boost: float = 5.0
    max_queue: int = CACHE_AWARE_MAX_QUEUE
    shares_prefixes = True

    def order(self, waiting: Sequence[Request], tree: Optional[RadixCache]) -> AdmissionOrder:
        if tree is None or len(waiting) > self.max_queue:
            return AdmissionOrder(list(waiting), strict=len(waiting))
        newest = max(r.arrival_time for r in waiting)
        resumed, overtaken, rest = [], [], []
        for r in waiting:
            if r.preemptions:
                resumed.append(r)
            elif newest - r.arrival_time > self.max_queue_wait_boost:
                overtaken.append(r)
            else:
                rest.append(r)
        overtaken.sort(key=lambda r: r.arrival_time)
        head = resumed + overtaken
        return AdmissionOrder(head + self._order_by_cache(rest, tree), strict=len(head))

    def _order_by_cache(self, reqs: list[Request], tree: RadixCache) -> list[Request]:
        raise NotImplementedError


class LongestPrefixPolicy(_CacheAwarePolicy):
    """Longest cached prefix first; ties keep queue order."""

    def _order_by_cache(self, reqs: list[Request], tree: RadixCache) -> list[Request]:
        hits = {id(r): cached_len(tree, r) for r in reqs}
        return sorted(reqs, key=lambda r: -hits[id(r)])


class DFSWeightPolicy(_CacheAwarePolicy):
    """Depth-first over the tree, heavier subtrees (more waiting requests under them) first.

    Requests whose cached prefixes sit in the same subtree run back to back, so a subtree is
    used up before eviction can take it; deeper matches come before shallower ones, and
    requests with nothing cached come last.
    """

    def _order_by_cache(self, reqs: list[Request], tree: RadixCache) -> list[Request]:
        at_node: dict[TreeNode, list[Request]] = defaultdict(list)
        for r in reqs:
            at_node[tree.match_length(r.token_ids, r.num_tokens - 1, r.params.cache_salt)[1]].append(r)
        weight: dict[TreeNode, int] = defaultdict(int)
        for node, here in at_node.items():
            while node is not None:
                weight[node] += len(here)
                node = node.parent
        ordered: list[Request] = []
        stack: list[tuple[TreeNode, bool]] = [(tree.root, False)]
        while stack:
            node, children_done = stack.pop()
            if children_done:
                ordered.extend(at_node.get(node, ()))
                continue
            stack.append((node, True))
            # pushed lightest first so that the heaviest child is visited first
            kids = sorted((c for c in node.children.values() if c in weight), key=lambda c: weight[c])
            stack.extend((c, False) for c in kids)
        return ordered


def make_policy(name: str, max_queue_wait_boost: float = 5.0) -> SchedulePolicy:
    if name == "lpm":
        return LongestPrefixPolicy(max_queue_wait_boost)
    if name == "dfs-weight":
        return DFSWeightPolicy(max_queue_wait_boost)
    if name == "fcfs":
        return FCFSPolicy()
    if name == "priority":
        return PriorityPolicy()
    raise ValueError(f"unknown schedule policy {name!r}")
