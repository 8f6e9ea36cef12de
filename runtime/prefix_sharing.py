"""In-batch prefix sharing: one request computes a prefix that several waiting requests share.

Without it, N requests arriving together with the same new system prompt are admitted
together and each prefills that prompt: N times the work for one prompt's worth of KV. Here
the first is admitted (the *leader*) and the others are held while it prefills; once its
chunk lands in the radix tree they match it and compute only their own suffix. The wait is
bounded: a leader's shared part takes the steps of its prefill (chunks of running requests
go before new admissions), and a request is never held more than `max_hold_steps` steps.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from radixserve.radix import RadixCache, common_prefix_len
from radixserve.runtime.request import Request
from radixserve.runtime.schedule_policy import cached_len

MIN_SHARED_TOKENS = 32   # a shorter shared part costs less to recompute than a step of waiting
MAX_HOLD_STEPS = 16      # safety net: e.g. a leader starved of pages must not hold others forever


@dataclass
class PrefixSharing:
    page_size: int
    min_shared_tokens: int = MIN_SHARED_TOKENS
    max_hold_steps: int = MAX_HOLD_STEPS
    _leaders: list[Request] = field(default_factory=list)

    def start_pass(self, running: list[Request]) -> None:
        """Begin one admission pass: running requests still prefilling their prompt lead."""
        self._leaders = [r for r in running if r.kv_len < len(r.prompt_ids)]

    def add_leader(self, req: Request) -> None:
        """A request admitted in this pass: it computes every token of its prompt not cached yet."""
        self._leaders.append(req)

    def should_hold(self, req: Request, tree: RadixCache) -> bool:
        """Whether `req` should wait this step (the scheduler counts the step once it commits it)."""
        if not self._leaders or req.held_steps >= self.max_hold_steps:
            return False
        limit = req.num_tokens - 1
        salt = req.params.cache_salt   # another tenant's prefill is never this request's cache
        shared = max((common_prefix_len(req.token_ids[:limit], leader.token_ids, self.page_size)
                      for leader in self._leaders if leader.params.cache_salt == salt), default=0)
        # cheap test first: most requests share at most a chat-template header with the leaders
        return shared >= self.min_shared_tokens and shared - cached_len(tree, req) >= self.min_shared_tokens
