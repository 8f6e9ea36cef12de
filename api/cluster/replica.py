"""One engine per Ray Serve replica. The ingress streams `generate`; Ray Serve calls
`record_routing_stats` every routing-stats period (what the router sees of this replica) and
`check_health` (a failing one is replaced)."""
from __future__ import annotations

import asyncio
import logging
from typing import AsyncIterator, Union

import torch
from ray import serve

from radixserve.api.cluster.protocol import Accepted, EngineCall, Refused, ReplicaInfo, ReplicaReport
from radixserve.runtime.config import EngineConfig
from radixserve.runtime.engine import Engine
from radixserve.runtime.engine_client import EngineHealth, EngineRefusal
from radixserve.runtime.request import RequestOutput

log = logging.getLogger("radixserve.replica")

# Page hashes a replica reports at most: 8 bytes each, so 32 KiB per report; at page size 16 that
# names 1M cached tokens (README, "Replicas on Ray Serve", for what this costs at 100 replicas).
DEFAULT_SUMMARY_PAGES = 4096


class EngineReplica:
    def __init__(self, config: EngineConfig, summary_pages: int = DEFAULT_SUMMARY_PAGES, threads: int = 1):
        logging.basicConfig(level=config.log_level.upper())
        torch.set_num_threads(threads)
        self.engine = Engine(config)
        self.summary_pages = summary_pages
        self.replica = serve.get_replica_context().replica_id.to_full_id_str()
        log.info("engine replica %s: %s on %s, KV cache %d tokens", self.replica, self.engine.model_name,
                 self.engine.device, self.engine.kv_capacity_tokens)

    def info(self) -> ReplicaInfo:
        e = self.engine
        return ReplicaInfo(self.replica, e.model_name, e.pool.page_size, e.kv_capacity_tokens, str(e.device),
                           str(e.dtype).replace("torch.", ""), e.admission.retentions)

    async def generate(self, call: EngineCall) -> AsyncIterator[Union[Accepted, Refused, RequestOutput]]:
        """First Accepted or Refused, then the request's outputs. A cancelled call (the client went
        away, or the ingress aborted it) aborts the engine request."""
        try:
            # off the replica's event loop: the first constrained request builds the grammar backend
            stream = await self.engine.start(call.prompt_ids, call.params, request_id=call.request_id)
        except EngineRefusal as refusal:
            yield Refused(refusal, self.replica)
            return
        finished = False
        try:
            yield Accepted(self.replica)
            async for out in stream:
                finished = out.finished
                yield out
        finally:
            if not finished:
                self.engine.abort(call.request_id)

    async def record_routing_stats(self) -> dict:
        # the summary waits for the loop thread's next pause between steps, off this event loop
        summary = await asyncio.to_thread(self.engine.prefix_summary, self.summary_pages)
        s, health = self.engine.stats(), self.engine.health()
        return ReplicaReport(
            replica=self.replica, taken_at=ReplicaReport.now(), alive=health.alive,
            page_size=summary.page_size, hashes=frozenset(summary.hashes), truncated=summary.truncated,
            num_running=s.num_running, num_waiting=s.num_waiting, kv_usage=s.kv_cache_usage,
            kv_capacity_tokens=self.engine.kv_capacity_tokens, prefix_hit_tokens=s.prefix_cache_hit_tokens,
            prefix_queried_tokens=s.prefix_cache_queried_tokens, prompt_tokens=s.prompt_tokens,
            generation_tokens=s.generation_tokens, kv_pages_used=s.kv_pages_used, kv_pages_cached=s.kv_pages_cached,
            kv_pages_free=s.kv_pages_free, forced_tokens=s.forced_tokens, window_pages=s.window_pages,
            window_pages_free=s.window_pages_free).to_stats()

    def health(self) -> EngineHealth:
        return self.engine.health()

    def check_health(self) -> None:
        health = self.engine.health()
        if not health.alive:
            raise RuntimeError(f"the engine stopped: {health.fatal_error or 'its loop thread ended'}")

    def __del__(self):
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutdown()
