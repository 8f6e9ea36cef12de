"""The real Scheduler, KVManager and radix tree driven without a model, on a fake clock.

Each step does what the engine does to the KV state (advance computed positions, cache
prefill chunks in the tree, append a token where the chunk samples, finish at max_tokens),
so scheduling decisions are exact and deterministic, and a workload of thousands of steps
runs in a second. Output tokens are a fixed function of the request and position.
"""
from __future__ import annotations

import itertools
import time
from typing import Optional

from radixserve.radix import KVPagePool, RequestPageTable
from radixserve.runtime.config import EngineConfig
from radixserve.runtime.kv_manager import KVManager
from radixserve.runtime.request import OutputStream, Request, RequestStatus
from radixserve.runtime.sampling_params import SamplingParams
from radixserve.runtime.scheduler import ScheduledBatch, Scheduler


class SimEngine:
    def __init__(self, kv_cache_tokens: int = 65536, step_seconds: float = 0.05, max_context: int = 8192,
                 **config):
        self.config = EngineConfig(kv_cache_tokens=kv_cache_tokens, **config)
        self.config.validate()
        p = self.config.page_size
        pool = KVPagePool(kv_cache_tokens // p, p)
        table = RequestPageTable(self.config.max_running_requests, -(-max_context // p), "cpu")
        self.kv = KVManager(pool, table, radix_enabled=not self.config.disable_radix_cache)
        self.now = 0.0
        self.step_seconds = step_seconds
        self.scheduler = Scheduler(self.config, self.kv)
        self.admitted: list[str] = []        # request ids in order of first admission
        self.finished: list[Request] = []
        self.steps = 0
        self.schedule_seconds: list[float] = []   # wall time of each schedule() call
        self._seen: set[str] = set()
        self._ids = itertools.count()

    def submit(self, prompt: list[int], max_tokens: int = 8, priority: int = 0,
               request_id: Optional[str] = None) -> Request:
        rid = request_id or f"r{next(self._ids)}"
        req = Request(rid, list(prompt), SamplingParams(max_tokens=max_tokens, temperature=0.0, priority=priority),
                      OutputStream(rid), arrival_time=self.now)
        self.scheduler.add(req)
        return req

    def step(self) -> Optional[ScheduledBatch]:
        t = time.perf_counter()
        batch = self.scheduler.schedule()
        self.schedule_seconds.append(time.perf_counter() - t)
        self.now += self.step_seconds
        if batch is None:
            return None
        self.steps += 1
        for it in batch.extends:
            if it.req.request_id not in self._seen:
                self._seen.add(it.req.request_id)
                self.admitted.append(it.req.request_id)
        sampling = [it.req for it in batch.items if it.samples]
        for it in batch.decodes:
            self.kv.advance(it.req, 1, cache=False)
        for it in batch.extends:
            self.kv.advance(it.req, it.num_tokens, cache=True)
        for req in sampling:
            req.append_token(100 + (hash(req.request_id) + len(req.output_ids)) % 1000)
            if len(req.output_ids) >= req.params.max_tokens:
                req.status = RequestStatus.FINISHED
                self.scheduler.remove(req, cache=True)
                self.finished.append(req)
        self.kv.check_invariant(self.scheduler.running)
        return batch

    def run(self, max_steps: int = 100_000) -> None:
        """Step until every submitted request has finished."""
        for _ in range(max_steps):
            if not self.scheduler.has_work():
                return
            if self.step() is None and self.scheduler.has_work():
                raise AssertionError("scheduler stalled with work left")
        raise AssertionError(f"not done after {max_steps} steps")

    @property
    def hit_ratio(self) -> float:
        s = self.scheduler.stats
        return s.cache_hit_tokens / max(1, s.prompt_tokens)
