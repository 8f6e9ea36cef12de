"""Which replica gets a request: the one whose radix tree holds the longest prefix of its prompt,
unless that replica's queue is much longer than the shortest one's. Pure policy: the Ray Serve
router (api/cluster/request_router.py) feeds it the replicas' reports and queue lengths, and unit tests feed it
fake ones.

What it knows of a replica is its last `ReplicaReport` (stale by at most one routing-stats period)
and the requests sent to it that its report cannot show yet: those in flight, and those finished
after the report was taken ("pending"). In that order it picks:
1. the replica whose reported tree holds the longest prefix (reason "cached");
2. else the one with the longest pending prefix (reason "pending"): a burst of requests on a new
   system prompt follows the first one to its replica before any report shows it cached;
3. else, only with `sticky`, the replica it was last sent to within `pending_ttl`, which has evicted
   it since (reason "pending"), so that each prompt's requests stay on one replica (what Ray Serve
   LLM's and SGLang's text routers do; bench/ray_router.py measures both ways);
4. else (no replica holds or was sent enough of it) the one with the fewest prefix pages held or
   pending, where it displaces the least (reason "cold"; ties: the least loaded).
A replica whose queue exceeds the shortest by more than `imbalance` is passed over ("balance").
Before all of these, a request with OpenAI's `prompt_cache_key` goes to the replica its key hashes
to (rendezvous hashing: a key moves only when its replica leaves), unless the balance guard passes
that replica over (reason "key")."""
from __future__ import annotations

import hashlib
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional, Sequence

from radixserve.api.cluster.protocol import ReplicaReport

# RouteDecision.reason
CACHED = "cached"      # the longest prefix is in the replica's reported tree
PENDING = "pending"    # sent there, not reported yet (or, `sticky`, sent there lately)
COLD = "cold"          # no replica holds enough of it: the smallest tree
BALANCE = "balance"    # a replica with a longer prefix was skipped: its queue is too long
FULL = "full"          # the ranking's first replica was at its concurrency limit: a later one took it
KEY = "key"            # the replica the request's prompt_cache_key hashes to

# Reports carry the replica's wall clock: this much skew between nodes is tolerated.
CLOCK_SKEW_S = 0.5


def _rendezvous(key: str, replica: str) -> int:
    """The weight of `replica` for `key`: the heaviest replica is the key's home."""
    return int.from_bytes(hashlib.blake2b(f"{key}\0{replica}".encode(), digest_size=8).digest(), "little")


@dataclass(frozen=True)
class RouteDecision:
    ranked: list[str]       # replica ids, best first: the next is tried when one is full
    reason: str
    matched_pages: int      # of the request's prefix, on the chosen replica
    request_pages: int


@dataclass
class _Replica:
    report: Optional[ReplicaReport] = None
    inflight: dict[str, tuple[float, list[int]]] = field(default_factory=dict)  # key -> (sent at, hashes)
    inflight_pages: Counter = field(default_factory=Counter)   # page hash -> in-flight requests with it
    finished: dict[int, float] = field(default_factory=dict)   # page hash -> when its last request ended
    sent: dict[int, float] = field(default_factory=dict)       # page hash -> when last sent (`sticky`)

    def pending(self, h: int) -> bool:
        return h in self.inflight_pages or h in self.finished


class PrefixRoutingPolicy:
    """`imbalance`: a replica whose queue exceeds the shortest by more than this is not chosen for
    its cache. `min_match_ratio`: a match covering less of the prompt than this (e.g. only the
    chat template's opening tokens, which every prompt shares) counts as cold. `pending_ttl`: a
    request not reported finished after this long is forgotten. `max_pending`: requests (and
    hashes) remembered per replica, oldest dropped first. The clock must be the replicas' wall
    clock (`time.time`): reports are stamped with it."""

    def __init__(self, imbalance: int = 8, pending_ttl: float = 60.0, min_match_ratio: float = 0.1,
                 sticky: bool = False, max_pending: int = 65536, clock=time.time):
        self.imbalance = imbalance
        self.pending_ttl = pending_ttl
        self.min_match_ratio = min_match_ratio
        self.sticky = sticky
        self.max_pending = max_pending
        self._clock = clock
        self._replicas: dict[str, _Replica] = {}

    # ---- what the router learns ---------------------------------------------------------
    def update(self, replica: str, report: Optional[ReplicaReport]) -> None:
        """A replica is (still) routable; `report` is its latest report, if any (older ones are ignored)."""
        state = self._replicas.setdefault(replica, _Replica())
        if report is not None and (state.report is None or report.taken_at >= state.report.taken_at):
            state.report = report
            settled = report.taken_at - CLOCK_SKEW_S  # what finished before this, the report shows
            state.finished = {h: t for h, t in state.finished.items() if t >= settled}

    def remove(self, replica: str) -> None:
        """The replica died or was scaled down: forget it and what was routed to it."""
        self._replicas.pop(replica, None)

    def retain(self, replicas: Sequence[str]) -> None:
        for gone in set(self._replicas) - set(replicas):
            self.remove(gone)

    def report(self, replica: str) -> Optional[ReplicaReport]:
        state = self._replicas.get(replica)
        return state.report if state else None

    def routed(self, replica: str, key: str, page_hashes: Sequence[int]) -> None:
        """Request `key` is sent to `replica` (moved there if it was counted elsewhere): its prefix
        will be cached there once prefilled."""
        for state in self._replicas.values():
            if key in state.inflight:
                self._end(state, key, cached=False)
        state = self._replicas.get(replica)
        if state is None:
            return
        now = self._clock()
        state.inflight[key] = (now, list(page_hashes))
        state.inflight_pages.update(page_hashes)
        for h in page_hashes:
            state.sent.pop(h, None)  # re-inserted last: the dict stays in sending order
            state.sent[h] = now
        self._bound(state)

    def completed(self, replica: str, key: str) -> None:
        """Request `key` ended on `replica`: its prefix is in that tree until a report says otherwise."""
        state = self._replicas.get(replica)
        if state is not None and key in state.inflight:
            self._end(state, key, cached=True)

    def _end(self, state: _Replica, key: str, cached: bool) -> None:
        _, hashes = state.inflight.pop(key)
        state.inflight_pages.subtract(hashes)
        for h in hashes:
            if state.inflight_pages[h] <= 0:
                del state.inflight_pages[h]
        if cached:
            now = self._clock()
            for h in hashes:
                state.finished[h] = now

    def _bound(self, state: _Replica) -> None:
        while len(state.inflight) > self.max_pending:
            self._end(state, next(iter(state.inflight)), cached=False)
        for table in (state.finished, state.sent):
            while len(table) > self.max_pending:
                del table[next(iter(table))]

    # ---- the decision --------------------------------------------------------------------
    def choose(self, page_hashes: Sequence[int], loads: dict[str, int],
               cache_key: Optional[str] = None) -> RouteDecision:
        """Rank the replicas in `loads` (replica id -> requests queued or running there) for a
        request whose prompt has these page hashes (and this prompt_cache_key, if any)."""
        if not loads:
            raise ValueError("no replica to route to")
        self._expire()
        candidates = sorted(loads, key=lambda r: (loads[r], self._kv_usage(r), r))
        matches = {r: self._match(r, page_hashes) for r in candidates}
        lowest = loads[candidates[0]]
        eligible = [r for r in candidates if loads[r] <= lowest + self.imbalance]
        if cache_key is not None:
            home = max(candidates, key=lambda r: _rendezvous(cache_key, r))
            if home in eligible:
                return RouteDecision([home] + [r for r in candidates if r != home], KEY, matches[home][1],
                                     len(page_hashes))
        wanted = max(1, int(self.min_match_ratio * len(page_hashes) + 0.999))
        # max() is stable: among equal matches, the least loaded
        cached = max(eligible, key=lambda r: matches[r])
        routed = max(eligible, key=lambda r: (matches[r][1], matches[r][0]))
        sticky = max(eligible, key=lambda r: self._sent_match(r, page_hashes)) if self.sticky else None
        if matches[cached][0] >= wanted:
            best, reason = cached, CACHED
        elif matches[routed][1] >= wanted:
            best, reason = routed, PENDING
        elif sticky is not None and self._sent_match(sticky, page_hashes) >= wanted:
            best, reason = sticky, PENDING
        else:
            best, reason = min(eligible, key=lambda r: (self._footprint(r), loads[r])), COLD
        if any(matches[r] > matches[best] and matches[r][1] >= wanted for r in candidates):
            reason = BALANCE
        ranked = [best] + [r for r in candidates if r != best]
        return RouteDecision(ranked, reason, matches[best][1], len(page_hashes))

    def _match(self, replica: str, page_hashes: Sequence[int]) -> tuple[int, int]:
        """Leading pages of the request the replica's last report says it holds, and leading pages
        it holds or has pending (at least as many)."""
        state = self._replicas.get(replica)
        if state is None:
            return 0, 0
        held = state.report.hashes if state.report is not None else frozenset()
        n = 0
        while n < len(page_hashes) and page_hashes[n] in held:
            n += 1
        m = n
        while m < len(page_hashes) and (page_hashes[m] in held or state.pending(page_hashes[m])):
            m += 1
        return n, m

    def _sent_match(self, replica: str, page_hashes: Sequence[int]) -> int:
        sent = self._replicas[replica].sent
        n = 0
        while n < len(page_hashes) and page_hashes[n] in sent:
            n += 1
        return n

    def _footprint(self, replica: str) -> int:
        """Distinct prefix pages the replica holds or was recently sent: where a new prefix
        displaces the least (SGLang's cache-aware router sends it to the smallest tree)."""
        state = self._replicas.get(replica)
        held = state.report.hashes if state.report is not None else frozenset()
        pending = set(state.inflight_pages) | set(state.finished)
        return len(held) + len(pending - held)

    def _kv_usage(self, replica: str) -> float:
        report = self.report(replica)
        return report.kv_usage if report is not None else 0.0

    def _expire(self) -> None:
        """Requests whose end was never reported (a lost callback) and `sticky` memories age out."""
        cutoff = self._clock() - self.pending_ttl
        for state in self._replicas.values():
            while state.inflight:
                key, (sent_at, _) = next(iter(state.inflight.items()))
                if sent_at >= cutoff:
                    break
                self._end(state, key, cached=False)
            while state.sent and next(iter(state.sent.values())) < cutoff:
                del state.sent[next(iter(state.sent))]
