"""Sampling parameters, validated once at submit time."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from radixserve.grammar.spec import GrammarSpec
from radixserve.runtime.engine_client import EngineRefusal, RefusalKind

MAX_TOP_LOGPROBS = 20
MAX_CACHE_SALT = 256


# as vLLM: below this temperature a request is greedy
GREEDY_BELOW_TEMPERATURE = 1e-5

@dataclass
class SamplingParams:
    max_tokens: int = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1                      # -1 or 0: disabled
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: Optional[int] = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: Optional[int] = None       # number of top alternatives; 0 = only the sampled token
    skip_special_tokens: bool = True
    constraint: Optional[GrammarSpec] = None  # structured output: the text must follow this grammar
    priority: int = 0                    # lower is admitted first under --schedule-policy priority
    # the tenant's prefix cache: requests share cached prefixes only with requests of the same salt
    # (None: the shared cache). Not a sampling setting, but one request's, like priority.
    cache_salt: Optional[str] = None
    # OpenAI's name for requests that share a prefix: their cache hits are counted under it, and
    # with replicas the router keeps one key on one replica
    prompt_cache_key: Optional[str] = None
    # OpenAI's: "in_memory" (None: the same), or "24h": its prefix stays in the disk tier for a day
    # whatever the LRU (needs --cache-dir)
    prompt_cache_retention: Optional[str] = None

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])

    @property
    def greedy(self) -> bool:
        # logits divided by a temperature this small overflow (or divide by a float32 zero)
        return self.temperature < GREEDY_BELOW_TEMPERATURE

    def validate(self, vocab_size: Optional[int] = None) -> None:
        """Raise EngineRefusal naming the first bad field."""
        def fail(name: str, msg: str):
            raise EngineRefusal(RefusalKind.INVALID, msg, name)

        def is_int(v) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        if not is_int(self.max_tokens) or self.max_tokens < 1:
            fail("max_tokens", f"must be an integer >= 1, got {self.max_tokens!r}")
        if not is_int(self.min_tokens) or self.min_tokens < 0:
            fail("min_tokens", f"must be an integer >= 0, got {self.min_tokens!r}")
        if self.min_tokens > self.max_tokens:
            fail("min_tokens", f"must not exceed max_tokens ({self.min_tokens} > {self.max_tokens})")
        if not 0.0 <= self.temperature <= 100.0:
            fail("temperature", f"must be in [0, 100], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            fail("top_p", f"must be in (0, 1], got {self.top_p}")
        if not is_int(self.top_k) or self.top_k < -1:
            fail("top_k", f"must be -1 (disabled) or a positive integer, got {self.top_k!r}")
        if not 0.0 <= self.min_p <= 1.0:
            fail("min_p", f"must be in [0, 1], got {self.min_p}")
        for name in ("frequency_penalty", "presence_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                fail(name, f"must be in [-2, 2], got {getattr(self, name)}")
        if not 0.0 < self.repetition_penalty <= 10.0:
            fail("repetition_penalty", f"must be in (0, 10], got {self.repetition_penalty}")
        if self.seed is not None and not is_int(self.seed):
            fail("seed", f"must be an integer, got {self.seed!r}")
        if not all(isinstance(s, str) and s for s in self.stop):
            fail("stop", "must be non-empty strings")
        if len(self.stop) > 16:
            fail("stop", "at most 16 stop strings")
        for t in self.stop_token_ids:
            if not is_int(t) or t < 0 or (vocab_size is not None and t >= vocab_size):
                fail("stop_token_ids", f"{t!r} is not a token id of this model")
        if not is_int(self.priority):
            fail("priority", f"must be an integer, got {self.priority!r}")
        if self.cache_salt is not None and not (isinstance(self.cache_salt, str)
                                                and 0 < len(self.cache_salt) <= MAX_CACHE_SALT):
            fail("cache_salt", f"must be a non-empty string of at most {MAX_CACHE_SALT} characters")
        if self.prompt_cache_key is not None and not (isinstance(self.prompt_cache_key, str)
                                                      and 0 < len(self.prompt_cache_key) <= MAX_CACHE_SALT):
            fail("prompt_cache_key", f"must be a non-empty string of at most {MAX_CACHE_SALT} characters")
        if self.prompt_cache_retention not in (None, "in_memory", "24h"):
            fail("prompt_cache_retention", f"must be 'in_memory' or '24h', got {self.prompt_cache_retention!r}")
        if self.logprobs is not None and (not is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_TOP_LOGPROBS):
            fail("logprobs", f"must be an integer in [0, {MAX_TOP_LOGPROBS}], got {self.logprobs!r}")
