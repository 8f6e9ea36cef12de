"""Continuous batching: which requests run this step, and how many tokens each computes."""
from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Optional

from radixserve.runtime.config import MAX_DECODE_ROWS, EngineConfig
from radixserve.runtime.decode_reservation import DecodeReservation
from radixserve.runtime.kv_manager import KVManager
from radixserve.runtime.prefix_sharing import PrefixSharing
from radixserve.runtime.request import Request, RequestStatus
from radixserve.runtime.schedule_policy import make_policy

log = logging.getLogger("radixserve.scheduler")

# Waiting requests examined per step: with a long queue of requests held for prefix sharing,
# scanning all of it every step would cost more than the step it schedules.
ADMISSION_SCAN_LIMIT = 256
# Requests passed over for lack of pages per step, where the order allows it (each costs a
# prefix match and a release).
MAX_PASSED_OVER = 16
# Beside other running requests, a run is computed at most this many rows a step, and a step holds
# at most this many rows of forced runs, all the requests' together (the rest next step; a request
# samples once its run is all in): a step that carries long runs delays every request that arrives
# during it. Capped per request only, four requests' runs made steps of up to 32 rows, and time to
# first token at concurrency 4 came out 11% over --no-jump-forward's; capped per step too, 0.97-1.0x
# of it in two sittings (bench/jump_forward.py)
SHARED_RUN_ROWS = 8


@dataclass
class ScheduledItem:
    req: Request
    num_tokens: int          # new tokens computed this step, from position req.kv_len (a decode: its rows)

    @property
    def samples(self) -> bool:
        """The chunk reaches the end of the request's tokens, so its last logits give a new token."""
        return self.req.kv_len + self.num_tokens == self.req.num_tokens


@dataclass
class ScheduledBatch:
    decodes: list[ScheduledItem] = field(default_factory=list)
    extends: list[ScheduledItem] = field(default_factory=list)
    admitted: int = 0            # requests taken from the queue this step (resumed ones included)
    cache_hit_tokens: int = 0    # tokens those found in the radix tree
    held: list[Request] = field(default_factory=list)   # waiting, held back for in-batch prefix sharing

    @property
    def items(self) -> list[ScheduledItem]:
        return self.decodes + self.extends

    @property
    def prefill_tokens(self) -> int:
        return sum(it.num_tokens for it in self.extends)


MAX_CACHE_KEYS = 100
OTHER_CACHE_KEYS = "(other)"


@dataclass
class SchedulerStats:
    """Running totals since start-up (read by the metrics endpoint)."""
    preemptions: int = 0
    cache_hit_tokens: int = 0     # prompt tokens served from the radix cache on first admission
    disk_hit_tokens: int = 0      # of them, read back from the disk tier (`--cache-dir`)
    prompt_tokens: int = 0        # prompt tokens of admitted requests (= prefix-cache queried tokens)
    prefill_tokens: int = 0       # tokens computed by prefill chunks, recomputation after preemption included
    held_for_sharing: int = 0     # times a request waited for another to prefill the prefix they share
    # prompt_cache_key -> [prompt tokens, of them cache hits]; the first MAX_CACHE_KEYS keys seen, the
    # rest under OTHER_CACHE_KEYS (a metric label per client-chosen string must stay bounded)
    by_cache_key: dict[str, list[int]] = field(default_factory=dict)

    def count_cache_key(self, key: str, prompt: int, hit: int) -> None:
        if key not in self.by_cache_key and len(self.by_cache_key) >= MAX_CACHE_KEYS:
            key = OTHER_CACHE_KEYS
        totals = self.by_cache_key.setdefault(key, [0, 0])
        totals[0] += prompt
        totals[1] += hit


def decode_rows(req: Request) -> int:
    """Rows `req` decodes this step: its newest token and any forced run before it; 0 when it
    prefills instead (a prompt, or outputs recomputed after a preemption, beyond MAX_DECODE_ROWS)."""
    n = req.num_tokens - req.kv_len
    return n if n == 1 or (req.kv_len >= len(req.prompt_ids) and n <= MAX_DECODE_ROWS) else 0


class Scheduler:
    def __init__(self, config: EngineConfig, kv: KVManager):
        self.config = config
        self.kv = kv
        self.policy = make_policy(config.schedule_policy, config.max_queue_wait_boost)
        self.reservation = DecodeReservation()
        self.sharing = PrefixSharing(kv.page_size) if self.policy.shares_prefixes and kv.radix_enabled else None
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
        while True:
            batch = self._try_schedule()
            if batch.decodes or batch.extends:
                break
            if len(self.running) <= 1:
                return None
            # every running prompt is stuck waiting for pages: free some by preempting one, and
            # plan the step again (what the failed plan counted is dropped with it)
            self.preempt(self._preemption_victim())
        for req in batch.held:
            req.held_steps += 1
        self.stats.held_for_sharing += len(batch.held)
        self.stats.prefill_tokens += batch.prefill_tokens
        self.reservation.on_step()
        return batch

    def _try_schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.config.max_batched_tokens
        chunk = self.config.chunked_prefill_size

        # A new prompt's first token should not wait behind forced runs (jump-forward) that it does
        # not need: a decode carrying a run sits out a step that admits a prompt, never two in a
        # row (bench/jump_forward.py's TTFT at concurrency 4)
        deferred: list[ScheduledItem] = []
        run_rows = SHARED_RUN_ROWS
        for req in self._decodes_with_pages():
            n = decode_rows(req) if len(self.running) == 1 else min(decode_rows(req), SHARED_RUN_ROWS, 1 + run_rows)
            run_rows -= n - 1
            if n > 1 and self.waiting and not req.run_deferred:
                deferred.append(ScheduledItem(req, n))
                continue
            req.run_deferred = False
            batch.decodes.append(ScheduledItem(req, n))
            budget -= n

        # prompts already being prefilled in chunks continue before new ones start
        for req in self.running:
            remaining = req.num_tokens - req.kv_len
            if decode_rows(req):
                continue
            if budget <= 0:
                break
            n = min(remaining, chunk, budget)
            if not self.kv.alloc(req, n):
                break
            batch.extends.append(ScheduledItem(req, n))
            budget -= n

        admitted = len(batch.extends)
        self._admit(batch, budget, chunk)
        for item in deferred:
            item.req.run_deferred = len(batch.extends) > admitted
            if not item.req.run_deferred:   # no prompt came in after all
                batch.decodes.append(item)
        return batch

    def _admit(self, batch: ScheduledBatch, budget: int, chunk: int) -> None:
        max_running = self.config.max_running_requests
        if not self.waiting or budget <= 0 or len(self.running) >= max_running:
            return
        tree = self.kv.tree if self.kv.radix_enabled else None
        order = self.policy.order(self.waiting, tree)
        p = self.kv.page_size
        # pages the running requests will still need: what is left of their prompts, and a
        # decaying share of their output budgets
        reserved = sum(self.reservation.pages(r, p) for r in self.running)
        if self.sharing is not None:
            self.sharing.start_pass(self.running)
        passed_over = 0
        for scanned, req in enumerate(order.requests):
            if budget <= 0 or len(self.running) >= max_running or scanned >= ADMISSION_SCAN_LIMIT:
                break
            if self.kv.table.num_free_rows == 0:
                break
            if self.sharing is not None and self.sharing.should_hold(req, tree):
                batch.held.append(req)
                continue
            cached = self.kv.match(req)
            n = min(req.num_tokens - req.kv_len, chunk, budget)
            # alone, a request always fits (submit rejects any that could not); next to others,
            # its own future pages and theirs must fit in what is free or evictable
            fits = not self.running or self.kv.available_pages() - self.reservation.pages(req, p) >= reserved
            if not fits or not self.kv.alloc(req, n, spare=len(self.running)):
                self.kv.release(req, cache=False)
                passed_over += 1
                if scanned < order.strict or passed_over >= MAX_PASSED_OVER:
                    break  # nothing may overtake it
                continue  # past the strict head the order is a preference (see AdmissionOrder)
            reserved += self.reservation.pages(req, p)
            self._start(req, cached, batch)
            batch.extends.append(ScheduledItem(req, n))
            budget -= n

    def _start(self, req: Request, cached: int, batch: ScheduledBatch) -> None:
        self.waiting.remove(req)
        req.status = RequestStatus.RUNNING
        req.held_steps = 0
        if not req.first_admitted:
            req.first_admitted = True
            req.cached_tokens = cached
            self.stats.cache_hit_tokens += cached
            self.stats.disk_hit_tokens += req.disk_hit_tokens
            self.stats.prompt_tokens += len(req.prompt_ids)
            if req.params.prompt_cache_key is not None:
                self.stats.count_cache_key(req.params.prompt_cache_key, len(req.prompt_ids), cached)
        batch.admitted += 1
        batch.cache_hit_tokens += cached
        self.running.append(req)
        if self.sharing is not None:
            self.sharing.add_leader(req)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("admit %s: %d of %d tokens cached%s", req.request_id, cached, req.num_tokens,
                      f" (resumed after {req.preemptions} preemptions)" if req.preemptions else "")

    def _decodes_with_pages(self) -> list[Request]:
        """Running requests ready to decode, each with a page for its next token.

        When pages run out even after eviction, the request with the least progress is
        preempted: its computed tokens go into the tree and it waits at the front of the queue.
        """
        ready = [r for r in self.running if decode_rows(r)]
        granted: list[Request] = []
        for req in ready:
            while req in self.running and not self.kv.alloc(req, decode_rows(req)):
                victim = self._preemption_victim()
                self.preempt(victim)
                if victim in granted:
                    granted.remove(victim)
            if req in self.running:
                granted.append(req)
        return granted

    def _preemption_victim(self) -> Request:
        """Fewest output tokens (least work lost, and its prompt is likely still cached); ties: newest."""
        return min(reversed(self.running), key=lambda r: len(r.output_ids))

    def preempt(self, req: Request) -> None:
        self.stats.preemptions += 1
        req.preemptions += 1
        self.reservation.on_preemption()
        log.debug("preempting %s at %d tokens (%d generated)", req.request_id, req.num_tokens,
                  len(req.output_ids))
        self.running.remove(req)
        self.kv.release(req, cache=True)
        req.status = RequestStatus.WAITING
        self.waiting.appendleft(req)
