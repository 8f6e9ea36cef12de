"""What the ingress and the engine replicas send each other (Ray Serve replicas, `--replicas`).
Plain dataclasses, so that neither side's code needs Ray to build or read them, and the router's
unit tests need no Ray workers."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from radixserve.runtime.engine_client import EngineRefusal
from radixserve.runtime.sampling_params import SamplingParams


@dataclass
class EngineCall:
    """One engine request sent to a replica. `page_hashes` (radix.prefix_hash, at the replicas'
    page size) is what the router matches against the replicas' trees; `prompt` is the prompt's
    text, for routers that match text (Ray Serve LLM's PrefixCacheAffinityRouter reads it)."""
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    page_hashes: list[int] = field(default_factory=list)
    prompt: str = ""


@dataclass(frozen=True)
class Accepted:
    """The replica's first reply: the request is queued in its engine."""
    replica: str  # Ray Serve's full replica id, e.g. SERVE_REPLICA::radixserve#EngineReplica#abc


@dataclass(frozen=True)
class Refused:
    """The replica's first and only reply when its engine refused the request: the refusal
    itself, which the ingress raises again as a local engine would."""
    refusal: EngineRefusal
    replica: str = ""


@dataclass(frozen=True)
class ReplicaInfo:
    """A replica's fixed facts, asked once by the ingress when it starts."""
    replica: str
    model_name: str
    page_size: int
    kv_capacity_tokens: int
    device: str
    dtype: str
    retentions: tuple[str, ...] = ("in_memory",)   # prompt_cache_retention values its engine keeps


@dataclass(frozen=True)
class ReplicaReport:
    """What one replica reports every routing-stats period (Ray Serve's `record_routing_stats`):
    its load, its engine totals, and what its radix tree holds, as prefix page hashes (most
    recently used first, at most the replica's limit). On the wire it is a dict of plain values
    (`to_stats` / `from_stats`), the hashes packed as uint64 bytes: 8 bytes per cached page."""
    replica: str
    taken_at: float            # time.time() on the replica
    alive: bool
    page_size: int
    hashes: frozenset
    truncated: bool            # the tree held more pages than the summary limit
    num_running: int
    num_waiting: int
    kv_usage: float
    kv_capacity_tokens: int
    prefix_hit_tokens: int
    prefix_queried_tokens: int
    prompt_tokens: int
    generation_tokens: int
    kv_pages_used: int = 0     # by owner, for the cache view (GET /v1/cache) summed over replicas
    kv_pages_cached: int = 0
    kv_pages_free: int = 0
    forced_tokens: int = 0
    window_pages: int = 0      # the sliding-window layers' own pool (0: none), and of it free
    window_pages_free: int = 0

    @property
    def queue(self) -> int:
        return self.num_running + self.num_waiting

    def to_stats(self) -> dict[str, Any]:
        stats = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "hashes"}
        stats["hashes"] = np.fromiter(self.hashes, dtype=np.uint64, count=len(self.hashes)).tobytes()
        stats["schema"] = "radixserve.replica_report.v1"
        return stats

    @classmethod
    def from_stats(cls, stats: Optional[dict[str, Any]]) -> Optional["ReplicaReport"]:
        """None for anything that is not a report (Ray's default empty stats before the first one)."""
        if not stats or stats.get("schema") != "radixserve.replica_report.v1":
            return None
        # fields a replica of an earlier version does not send keep their defaults
        values = {k: stats[k] for k in cls.__dataclass_fields__ if k != "hashes" and k in stats}
        hashes = frozenset(np.frombuffer(stats["hashes"], dtype=np.uint64).tolist())
        return cls(hashes=hashes, **values)

    @staticmethod
    def now() -> float:
        return time.time()
