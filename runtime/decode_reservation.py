"""KV pages kept back at admission for the tokens running requests will still decode.

How many output tokens a request will really produce is unknown (most stop well before
`max_tokens`), so only a share of each request's remaining budget is reserved. The share
starts conservative, decays step by step while no preemption happens (the batch gets
fuller), and resets when one does: SGLang's `new_token_ratio` idea.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from radixserve.runtime.request import Request

# `max_tokens` is often just "up to the context": count at most this many future tokens per request
CLIP_FUTURE_TOKENS = 4096


@dataclass
class DecodeReservation:
    initial_ratio: float = 0.7
    min_ratio: float = 0.1
    decay_steps: int = 600       # steps without a preemption to decay from initial to min
    ratio: float = field(init=False)

    def __post_init__(self):
        self.ratio = self.initial_ratio

    def on_step(self) -> None:
        self.ratio = max(self.min_ratio, self.ratio - (self.initial_ratio - self.min_ratio) / self.decay_steps)

    def on_preemption(self) -> None:
        self.ratio = self.initial_ratio

    def pages(self, req: Request, page_size: int) -> int:
        """Pages `req` will still need beyond those it holds: for the rest of its known tokens
        (prompt chunks still to prefill; certain) and a share of its remaining output budget."""
        remaining_output = min(req.params.max_tokens - len(req.output_ids), CLIP_FUTURE_TOKENS)
        need = req.num_tokens + self.ratio * remaining_output - len(req.pages) * page_size
        return max(0, math.ceil(need / page_size))
