"""Continuous batching: which requests run this step, and how many tokens each computes."""
from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Optional

from runtime.config import EngineConfig
from runtime.kv_manager import KVManager
from runtime.request import Request, RequestStatus
from runtime.schedule_policy import make_policy

log = logging.getLogger("radixserve.scheduler")


@dataclass
class ScheduledItem:
    req: Request
    num_tokens: int          # new tokens computed this step, from position req.kv_len

    @property
    def samples(self) -> bool:
        """The chunk reaches the end of the request's tokens, so its last logits give a new token."""
        return self.req.kv_len + self.num_tokens == self.req.num_tokens


@dataclass
class ScheduledBatch:
    decodes: list[ScheduledItem] = field(default_factory=list)
    extends: list[ScheduledItem] = field(default_factory=list)

    @property
    def items(self) -> list[ScheduledItem]:
        return self.decodes + self.extends


@dataclass
class SchedulerStats:
    """Running totals since start-up (read by the metrics endpoint)."""
    preemptions: int = 0
    cache_hit_tokens: int = 0     # prompt tokens served from the radix cache on first admission
    prompt_tokens: int = 0        # prompt tokens of admitted requests (= prefix-cache queried tokens)


class Scheduler:
    def __init__(self, config: EngineConfig, kv: KVManager):
        self.config = config
        self.kv = kv
        self.policy = make_policy(config.schedule_policy)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.stats = SchedulerStats()

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def remove(self, req: Request, cache: bool = True) -> None:
        """Take a request out of the queues and give back its KV."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.kv.release(req, cache=cache and self.kv.radix_enabled)

    # ---- one step ----------------------------------------------------------
    def schedule(self) -> Optional[ScheduledBatch]:
        batch = ScheduledBatch()
        budget = self.config.max_batched_tokens
        chunk = self.config.chunked_prefill_size

        for req in self._decodes_with_pages():
            batch.decodes.append(ScheduledItem(req, 1))
            budget -= 1

        # prompts already being prefilled in chunks continue before new ones start
        for req in self.running:
            remaining = req.num_tokens - req.kv_len
            if remaining <= 1:
                continue
            if budget <= 0:
                break
            n = min(remaining, chunk, budget)
            if not self.kv.alloc(req, n):
                break
            batch.extends.append(ScheduledItem(req, n))
            budget -= n

        self._admit(batch, budget, chunk)
        if not (batch.decodes or batch.extends):
            if len(self.running) > 1:
                # every running prompt is stuck waiting for pages: free some by preempting the newest
                self.preempt(self.running[-1])
                return self.schedule()
            return None
        return batch

    def _admit(self, batch: ScheduledBatch, budget: int, chunk: int) -> None:
        if not self.waiting or budget <= 0:
            return
        order = self.policy.order(self.waiting, self.kv.tree if self.kv.radix_enabled else None)
        # keep one page per running request free for its next decode token
        reserve = len(self.running)
        for req in order:
            if budget <= 0 or len(self.running) >= self.config.max_running_requests:
                break
            if self.kv.table.num_free_rows == 0:
                break
            cached = self.kv.match(req)
            n = min(req.num_tokens - req.kv_len, chunk, budget)
            need = self.kv.pages_needed(req, n)
            if self.kv.available_pages() - need < reserve or not self.kv.alloc(req, n):
                self.kv.release(req, cache=False)
                break
            self.waiting.remove(req)
            req.status = RequestStatus.RUNNING
            if not req.first_admitted:
                req.first_admitted = True
                req.cached_tokens = cached
                self.stats.cache_hit_tokens += cached
                self.stats.prompt_tokens += len(req.prompt_ids)
            self.running.append(req)
            batch.extends.append(ScheduledItem(req, n))
            budget -= n

    def _decodes_with_pages(self) -> list[Request]:
        """Running requests ready to decode, each with a page for its next token.

        When pages run out even after eviction, the newest request is preempted:
        its computed tokens go into the tree and it waits at the front of the queue.
        """
        ready = [r for r in self.running if r.num_tokens - r.kv_len == 1]
        granted: list[Request] = []
        for req in ready:
            while req in self.running and not self.kv.alloc(req, 1):
                victim = self.running[-1]
                self.preempt(victim)
                if victim in granted:
                    granted.remove(victim)
            if req in self.running:
                granted.append(req)
        return granted

    def preempt(self, req: Request) -> None:
        self.stats.preemptions += 1
        log.debug("preempting %s at %d tokens", req.request_id, req.num_tokens)
        self.running.remove(req)
        self.kv.release(req, cache=True)
        req.status = RequestStatus.WAITING
        self.waiting.appendleft(req)

