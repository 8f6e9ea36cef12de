"""What the ingress knows of its engine replicas: their latest reports and the routing decisions
taken, written by the request router (which Ray Serve runs in the ingress's process) and read by
the ingress's health and `/metrics`."""
from __future__ import annotations

import threading
from collections import Counter
from typing import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from radixserve.api.cluster.protocol import ReplicaReport

# How often replicas report (Ray Serve's request_routing_stats_period_s): the staleness bound of
# what the router knows of each replica's tree.
REPORT_PERIOD_S = 1.0


class ClusterView:
    def __init__(self):
        self._lock = threading.Lock()
        self._reports: dict[str, ReplicaReport] = {}
        self._decisions: Counter = Counter()  # (reason, replica) -> requests routed

    def set_report(self, report: ReplicaReport) -> None:
        with self._lock:
            old = self._reports.get(report.replica)
            if old is None or report.taken_at >= old.taken_at:
                self._reports[report.replica] = report

    def drop(self, replica: str) -> None:
        with self._lock:
            self._reports.pop(replica, None)

    def reports(self) -> list[ReplicaReport]:
        with self._lock:
            return list(self._reports.values())

    def count(self, reason: str, replica: str) -> None:
        with self._lock:
            self._decisions[(reason, replica)] += 1

    def decisions(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._decisions)


CLUSTER = ClusterView()


class ClusterCollector(Collector):
    """Routing decisions by reason, each replica's load as it last reported it, and the prefix
    hit ratio over all replicas (cached prompt tokens / prompt tokens looked up)."""

    def __init__(self, view: ClusterView = CLUSTER):
        self.view = view

    def collect(self) -> Iterator[Metric]:
        routed = CounterMetricFamily("radixserve_router_requests", "Engine requests routed, by the router's "
                                     "reason and the replica chosen", labels=["reason", "replica"])
        for (reason, replica), n in sorted(self.view.decisions().items()):
            routed.add_metric([reason, replica], n)
        yield routed
        reports = sorted(self.view.reports(), key=lambda r: r.replica)
        for name, doc, value in (
            ("radixserve_replica_requests_running", "Requests in the replica's running batch", lambda r: r.num_running),
            ("radixserve_replica_requests_waiting", "Requests queued in the replica's engine", lambda r: r.num_waiting),
            ("radixserve_replica_kv_cache_usage_ratio", "Share of the replica's KV pages in use", lambda r: r.kv_usage),
            ("radixserve_replica_cached_pages_reported", "Prefix page hashes in the replica's last report",
             lambda r: len(r.hashes)),
            ("radixserve_replica_report_age_seconds", "Seconds since the replica's last report",
             lambda r: max(0.0, ReplicaReport.now() - r.taken_at)),
        ):
            gauge = GaugeMetricFamily(name, doc, labels=["replica"])
            for r in reports:
                gauge.add_metric([r.replica], value(r))
            yield gauge
        queried = sum(r.prefix_queried_tokens for r in reports)
        hit = sum(r.prefix_hit_tokens for r in reports)
        yield GaugeMetricFamily("radixserve_cluster_prefix_hit_ratio", "Prompt tokens served from some replica's "
                                "prefix cache / prompt tokens, over all replicas' last reports",
                                value=hit / queried if queried else 0.0)
