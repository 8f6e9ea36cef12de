"""Which replica gets a request: the one whose radix tree holds the longest prefix of its prompt,
unless that replica's queue is much longer than the shortest one's. Pure policy: the Ray Serve
router (api/ray_router.py) feeds it the replicas' reports and queue lengths, and unit tests feed it
fake ones.

What it knows of a replica is its last `ReplicaReport` (stale by at most one routing-stats period)
plus the prefixes routed to it in the last `pending_ttl` seconds ("pending"). In that order:
1. the replica whose reported tree holds the longest prefix (reason "cached");
2. else the one the prefix was routed to last (reason "pending"): a burst of requests on a new
   system prompt goes to one replica, not to all of them, before any report shows it cached; and
   a prefix that replica has since evicted goes back there too, so that each prompt's requests
   stay on one replica and the next ones hit what this one re-prefills;
3. else (no replica holds or was sent enough of it) the one with the fewest prefix pages held or
   pending, where it displaces the least (reason "cold"; ties: the least loaded).
A replica whose queue exceeds the shortest by more than `imbalance` is passed over ("balance")."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional, Sequence

from radixserve.api.replica_protocol import ReplicaReport

# RouteDecision.reason
CACHED = "cached"      # the longest prefix is in the replica's reported tree
PENDING = "pending"    # no tree reports it; it was routed there recently
COLD = "cold"          # no replica holds enough of it: least loaded
BALANCE = "balance"    # a replica with a longer prefix was skipped: its queue is too long
FULL = "full"          # the ranking's first replica was at its concurrency limit: a later one took it
REASONS = (CACHED, PENDING, COLD, BALANCE, FULL)


@dataclass(frozen=True)
class RouteDecision:
    ranked: list[str]       # replica ids, best first: the next is tried when one is full
    reason: str
    matched_pages: int      # of the request's prefix, on the chosen replica
    request_pages: int


@dataclass
class _Replica:
    report: Optional[ReplicaReport] = None
    pending: dict[int, float] = field(default_factory=dict)  # page hash -> when it was routed here


class PrefixRoutingPolicy:
    """`imbalance`: a replica whose queue exceeds the shortest by more than this is not chosen for
    its cache. `min_match_ratio`: a match covering less of the prompt than this (e.g. only the
    chat template's opening tokens, which every prompt shares) counts as cold. `max_pending`:
    pending hashes kept per replica (oldest dropped first)."""

    def __init__(self, imbalance: int = 8, pending_ttl: float = 60.0, min_match_ratio: float = 0.1,
                 max_pending: int = 65536, clock=time.monotonic):
        self.imbalance = imbalance
        self.pending_ttl = pending_ttl
        self.min_match_ratio = min_match_ratio
        self.max_pending = max_pending
        self._clock = clock
        self._replicas: dict[str, _Replica] = {}

    # ---- what the router learns ---------------------------------------------------------
    def update(self, replica: str, report: Optional[ReplicaReport]) -> None:
        """A replica is (still) routable; `report` is its latest report, if any (older ones are ignored)."""
        state = self._replicas.setdefault(replica, _Replica())
        if report is not None and (state.report is None or report.taken_at >= state.report.taken_at):
            state.report = report

    def remove(self, replica: str) -> None:
        """The replica died or was scaled down: forget it and what was routed to it."""
        self._replicas.pop(replica, None)

    def retain(self, replicas: Sequence[str]) -> None:
        for gone in set(self._replicas) - set(replicas):
            self.remove(gone)

    def report(self, replica: str) -> Optional[ReplicaReport]:
        state = self._replicas.get(replica)
        return state.report if state else None

    def routed(self, replica: str, page_hashes: Sequence[int]) -> None:
        """The request was sent to `replica`: its prefix will be cached there once prefilled."""
        state = self._replicas.get(replica)
        if state is None:
            return
        now = self._clock()
        for h in page_hashes:
            state.pending.pop(h, None)  # re-inserted last: the dict stays in routing order
            state.pending[h] = now
        while len(state.pending) > self.max_pending:
            del state.pending[next(iter(state.pending))]

    # ---- the decision --------------------------------------------------------------------
    def choose(self, page_hashes: Sequence[int], loads: dict[str, int]) -> RouteDecision:
        """Rank the replicas in `loads` (replica id -> requests queued or running there) for a
        request whose prompt has these page hashes."""
        if not loads:
            raise ValueError("no replica to route to")
        self._expire()
        candidates = sorted(loads, key=lambda r: (loads[r], self._kv_usage(r), r))
        matches = {r: self._match(r, page_hashes) for r in candidates}
        lowest = loads[candidates[0]]
        eligible = [r for r in candidates if loads[r] <= lowest + self.imbalance]
        wanted = max(1, int(self.min_match_ratio * len(page_hashes) + 0.999))
        # max() is stable: among equal matches, the least loaded
        cached = max(eligible, key=lambda r: matches[r])
        routed = max(eligible, key=lambda r: (matches[r][1], matches[r][0]))
        if matches[cached][0] >= wanted:
            best, reason = cached, CACHED
        elif matches[routed][1] >= wanted:
            best, reason = routed, PENDING
        else:
            best, reason = min(eligible, key=lambda r: (self._footprint(r), loads[r])), COLD
        if any(matches[r] > matches[best] and matches[r][1] >= wanted for r in candidates):
            reason = BALANCE
        ranked = [best] + [r for r in candidates if r != best]
        return RouteDecision(ranked, reason, matches[best][1], len(page_hashes))

    def _match(self, replica: str, page_hashes: Sequence[int]) -> tuple[int, int]:
        """Leading pages of the request the replica's last report says it holds, and leading pages
        it holds or was routed since (at least as many)."""
        state = self._replicas.get(replica)
        if state is None:
            return 0, 0
        held = state.report.hashes if state.report is not None else frozenset()
        n = 0
        while n < len(page_hashes) and page_hashes[n] in held:
            n += 1
        m = n
        while m < len(page_hashes) and (page_hashes[m] in held or page_hashes[m] in state.pending):
            m += 1
        return n, m

    def _footprint(self, replica: str) -> int:
        """Distinct prefix pages the replica holds or was recently sent: where a new prefix
        displaces the least (SGLang's cache-aware router sends it to the smallest tree)."""
        state = self._replicas.get(replica)
        held = state.report.hashes if state.report is not None else frozenset()
        return len(held) + sum(1 for h in state.pending if h not in held)

    def _kv_usage(self, replica: str) -> float:
        report = self.report(replica)
        return report.kv_usage if report is not None else 0.0

    def _expire(self) -> None:
        cutoff = self._clock() - self.pending_ttl
        for state in self._replicas.values():
            pending = state.pending
            while pending:
                h, t = next(iter(pending.items()))
                if t >= cutoff:
                    break
                del pending[h]
