"""Prometheus metrics: the engine's load and totals, read at scrape time from the engine client's `stats()`,
and request-level counters and latency histograms measured on the API side. Each app has its own
registry, so several apps (tests) can share one process."""
from __future__ import annotations

import time
from typing import Callable, Iterator, Optional

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from radixserve.runtime.engine_client import EngineClient

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)


class _EngineCollector(Collector):
    """Gauges and counters straight from the engine's snapshot (nothing when it is still loading)."""

    def __init__(self, get_engine: Callable[[], Optional[EngineClient]]):
        self._get_engine = get_engine

    def collect(self) -> Iterator[Metric]:
        engine = self._get_engine()
        if engine is None:
            return
        s = engine.stats()
        yield GaugeMetricFamily("radixserve_num_requests_running", "Requests in the running batch",
                                value=s.num_running)
        yield GaugeMetricFamily("radixserve_num_requests_waiting", "Requests queued for admission",
                                value=s.num_waiting)
        yield GaugeMetricFamily("radixserve_kv_cache_usage_ratio",
                                "Share of KV pages held by requests or the prefix tree", value=s.kv_cache_usage)
        pages = GaugeMetricFamily("radixserve_kv_pages", "KV pages by owner: held by running requests (used), "
                                  "owned by the prefix tree (cached), free", labels=["state"])
        for state, value in (("used", s.kv_pages_used), ("cached", s.kv_pages_cached), ("free", s.kv_pages_free)):
            pages.add_metric([state], value)
        yield pages
        if s.window_pages:
            window = GaugeMetricFamily("radixserve_kv_window_pages", "The sliding-window layers' own KV pages: "
                                       "those some KV page holds (attached), free", labels=["state"])
            window.add_metric(["attached"], s.window_pages - s.window_pages_free)
            window.add_metric(["free"], s.window_pages_free)
            yield window
        for name, doc, value in (
            ("radixserve_prefix_cache_queried_tokens", "Prompt tokens looked up in the prefix cache",
             s.prefix_cache_queried_tokens),
            ("radixserve_prefix_cache_hit_tokens", "Prompt tokens served from the prefix cache",
             s.prefix_cache_hit_tokens),
            ("radixserve_prompt_tokens", "Prompt tokens admitted", s.prompt_tokens),
            ("radixserve_generation_tokens", "Tokens generated", s.generation_tokens),
            ("radixserve_jump_forward_tokens", "Generated tokens a grammar forced, appended without a decode step",
             s.forced_tokens),
            ("radixserve_preemptions", "Requests preempted for KV pages", s.preemptions),
        ):
            yield CounterMetricFamily(name, doc, value=value)
        tiers = CounterMetricFamily("radixserve_prefix_cache_tier_hit_tokens",
                                    "Prompt tokens served from the prefix cache, by tier", labels=["tier"])
        tiers.add_metric(["memory"], s.prefix_cache_hit_tokens - s.prefix_cache_disk_hit_tokens)
        tiers.add_metric(["disk"], s.prefix_cache_disk_hit_tokens)
        yield tiers
        if s.cache_dir is not None:
            d = s.cache_dir
            yield GaugeMetricFamily("radixserve_cache_dir_bytes", "Bytes of KV pages in --cache-dir", value=d.bytes)
            yield GaugeMetricFamily("radixserve_cache_dir_pages", "KV pages in --cache-dir", value=d.files)
            for name, doc, value in (
                ("radixserve_cache_dir_written_bytes", "Bytes of KV pages written to --cache-dir", d.bytes_written),
                ("radixserve_cache_dir_read_bytes", "Bytes of KV pages read back from --cache-dir", d.bytes_read),
                ("radixserve_cache_dir_corrupt_files", "Page files dropped as short, torn or failing their "
                 "checksum", d.corrupt_dropped),
                ("radixserve_cache_dir_dropped_writes", "Pages not written: the write queue was full, or the "
                 "directory full of retained pages", d.writes_dropped),
                ("radixserve_cache_dir_evicted_files", "Page files deleted by --cache-dir-size", d.evicted),
            ):
                yield CounterMetricFamily(name, doc, value=value)
        for name, doc, index in (
            ("radixserve_prompt_cache_key_prompt_tokens", "Prompt tokens admitted, by prompt_cache_key", 0),
            ("radixserve_prompt_cache_key_hit_tokens", "Of those, served from the prefix cache, by prompt_cache_key", 1),
        ):
            family = CounterMetricFamily(name, doc, labels=["key"])
            for key, totals in s.cache_keys.items():
                family.add_metric([key], totals[index])
            yield family


class ServerMetrics:
    def __init__(self, get_engine: Callable[[], Optional[EngineClient]]):
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(get_engine))
        self.requests = Counter("radixserve_requests", "Finished requests (one per choice) by finish reason",
                                ["finish_reason"], registry=self.registry)
        self.ttft = Histogram("radixserve_time_to_first_token_seconds", "Time from arrival to the first token",
                              buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.tpot = Histogram("radixserve_time_per_output_token_seconds",
                              "Mean time between output tokens after the first", buckets=_TPOT_BUCKETS,
                              registry=self.registry)
        self.e2e = Histogram("radixserve_e2e_request_latency_seconds", "Time from arrival to the last token",
                             buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.drain = Counter("radixserve_drain_requests",
                             "HTTP requests in flight at shutdown: finished in time (drained) or aborted at the "
                             "shutdown timeout", ["outcome"], registry=self.registry)

    def count_drain(self, outcome: str, requests: int) -> None:
        self.drain.labels(outcome=outcome).inc(requests)

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class RequestTimer:
    """Latency of one engine request (one choice), recorded once when it ends."""

    def __init__(self, metrics: ServerMetrics, arrival: float):
        self.metrics = metrics
        self.arrival = arrival
        self.first_token: Optional[float] = None
        self.tokens = 0
        self.done = False

    def on_tokens(self, count: int) -> None:
        if count and self.first_token is None:
            self.first_token = time.monotonic()
        self.tokens += count

    def finish(self, finish_reason: str) -> None:
        if self.done:
            return
        self.done = True
        now = time.monotonic()
        self.metrics.requests.labels(finish_reason=finish_reason).inc()
        if self.first_token is None:
            return
        self.metrics.ttft.observe(self.first_token - self.arrival)
        self.metrics.e2e.observe(now - self.arrival)
        if self.tokens > 1:
            self.metrics.tpot.observe((now - self.first_token) / (self.tokens - 1))
