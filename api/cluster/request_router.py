"""Ray Serve request router for the engine replicas: PrefixRoutingPolicy on the replicas' own
reports of their radix trees (Ray Serve's routing stats) and Ray Serve's queue-length cache.

Ray Serve creates the router inside the process that holds the deployment handle (the ingress),
so what it learns is shared with the ingress's `/metrics` and health through
cluster_view.cluster_view.CLUSTER."""
from __future__ import annotations

import logging
from typing import Optional

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from radixserve.api.cluster import view as cluster_view
from radixserve.api.cluster.prefix_routing import FULL, PrefixRoutingPolicy, RouteDecision
from radixserve.api.cluster.protocol import EngineCall, ReplicaReport

log = logging.getLogger("radixserve.router")

_MAX_DECISIONS = 4096


def engine_call(pending_request: Optional[PendingRequest]) -> Optional[EngineCall]:
    if pending_request is None:
        return None
    return next((a for a in pending_request.args if isinstance(a, EngineCall)), None)


class RadixPrefixRouter(RequestRouter):
    """Route each EngineCall to the replica whose tree holds the longest prefix of its prompt,
    guarded by load; anything else (`info`) to the shortest queue."""

    def initialize_state(self, imbalance: int = 8, pending_ttl_s: float = 60.0,
                         min_match_ratio: float = 0.1, sticky: bool = False) -> None:
        self.policy = PrefixRoutingPolicy(imbalance, pending_ttl_s, min_match_ratio, sticky)
        self._decisions: dict[str, RouteDecision] = {}  # internal request id -> its decision

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: Optional[PendingRequest] = None) -> list[list[RunningReplica]]:
        by_id = {r.replica_id.to_full_id_str(): r for r in candidate_replicas}
        loads = {}
        for rid, replica in by_id.items():
            report = ReplicaReport.from_stats(replica.routing_stats)
            self.policy.update(rid, report)
            if report is not None:
                cluster_view.CLUSTER.set_report(report)
            queued = self.replica_queue_len_cache.get(replica.replica_id)
            loads[rid] = queued if queued is not None else (report.queue if report is not None else 0)
        call = engine_call(pending_request)
        if call is None or not by_id:
            return [sorted(candidate_replicas, key=lambda r: loads[r.replica_id.to_full_id_str()])]
        decision = self.policy.choose(call.page_hashes, loads, call.params.prompt_cache_key)
        # counted as pending now, not once sent: Ray Serve may choose for the next request before
        # this one is sent, and a burst on a new prompt must not go cold to every replica
        key = pending_request.metadata.internal_request_id
        self.policy.routed(decision.ranked[0], key, call.page_hashes)
        self._decisions[key] = decision
        while len(self._decisions) > _MAX_DECISIONS:  # requests cancelled before they were sent
            del self._decisions[next(iter(self._decisions))]
        return [[by_id[rid]] for rid in decision.ranked]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result) -> None:
        call = engine_call(pending_request)
        if call is None:
            return
        rid, key = replica_id.to_full_id_str(), pending_request.metadata.internal_request_id
        decision = self._decisions.pop(key, None)
        if decision is None or decision.ranked[0] != rid:
            self.policy.routed(rid, key, call.page_hashes)
        if decision is not None:
            # a replica further down the ranking took it: the better ones were full
            reason = decision.reason if decision.ranked[0] == rid else FULL
            cluster_view.CLUSTER.count(reason, rid)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        self.policy.completed(replica_id.to_full_id_str(), internal_request_id)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        rid = replica_id.to_full_id_str()
        log.warning("engine replica %s died: no longer routed to", rid)
        self.policy.remove(rid)
        cluster_view.CLUSTER.drop(rid)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        ids = [r.replica_id.to_full_id_str() for r in replicas]
        self.policy.retain(ids)
        for r in replicas:
            report = ReplicaReport.from_stats(r.routing_stats)
            self.policy.update(r.replica_id.to_full_id_str(), report)
            if report is not None:
                cluster_view.CLUSTER.set_report(report)
        for gone in {r.replica for r in cluster_view.CLUSTER.reports()} - set(ids):
            cluster_view.CLUSTER.drop(gone)
