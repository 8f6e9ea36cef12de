"""The real Scheduler, KVManager and radix tree driven without a model, on a fake clock.

Each step does what the engine does to the KV state (advance computed positions, cache
prefill chunks in the tree, append a token where the chunk samples, finish at max_tokens),
so scheduling decisions are exact and deterministic, and a workload of thousands of steps
runs in a second. Output tokens are a fixed function of the request and position.

With `window`, the sim also keeps what each KV slot and window slot holds (the token prefix whose
last position was computed there), and checks every step that what each request is about to read
(every earlier position for global layers, its window for windowed ones) holds its own prefix:
what a forward pass would compute without any cache.
"""
from __future__ import annotations

import itertools
import time
from typing import Optional

from radixserve.radix import KVPagePool, RequestPageTable, WindowPages
from radixserve.runtime.config import EngineConfig
from radixserve.runtime.kv_manager import KVManager
from radixserve.runtime.request import OutputStream, Request, RequestStatus
from radixserve.runtime.sampling_params import SamplingParams
from radixserve.runtime.scheduler import ScheduledBatch, Scheduler


class SimEngine:
    def __init__(self, kv_cache_tokens: int = 65536, step_seconds: float = 0.05, max_context: int = 8192,
                 window: int = 0, window_tokens: int = 0, **config):
        self.config = EngineConfig(kv_cache_tokens=kv_cache_tokens, **config)
        self.config.validate()
        p = self.config.page_size
        pool = KVPagePool(kv_cache_tokens // p, p)
        table = RequestPageTable(self.config.max_running_requests, -(-max_context // p), "cpu")
        windows = WindowPages(pool.num_pages, window_tokens // p, p) if window else None
        self.kv = KVManager(pool, table, radix_enabled=not self.config.disable_radix_cache, windows=windows,
                            window=window)
        self.window = window
        self.slots: dict[int, tuple] = {}          # KV slot -> the prefix computed there
        self.window_slots: dict[int, tuple] = {}   # window slot -> the same
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
        if self.window:
            for it in batch.items:
                self._compute(it.req, it.num_tokens)
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

    def _compute(self, req: Request, n: int) -> None:
        """Check what `req`'s next `n` positions read, then write them."""
        p, w, of = self.config.page_size, self.window, self.kv.windows.of
        tokens = req.token_ids
        for pos in range(req.kv_len):
            slot = req.pages[pos // p] * p + pos % p
            assert self.slots.get(slot) == tuple(tokens[:pos + 1]), f"{req.request_id} reads a wrong KV slot at {pos}"
        for pos in range(max(0, req.kv_len - w + 1), req.kv_len):
            page = of(req.pages[pos // p])
            assert page >= 0, f"{req.request_id}'s window reaches position {pos}, which has no window page"
            assert self.window_slots.get(page * p + pos % p) == tuple(tokens[:pos + 1]), \
                f"{req.request_id} reads a wrong window slot at {pos}"
        for pos in range(req.kv_len, req.kv_len + n):
            page, prefix = req.pages[pos // p], tuple(tokens[:pos + 1])
            self.slots[page * p + pos % p] = prefix
            assert of(page) >= 0, f"{req.request_id} writes position {pos} to a page without a window page"
            self.window_slots[of(page) * p + pos % p] = prefix

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
