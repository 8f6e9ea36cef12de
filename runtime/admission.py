"""The one admission rule: a prompt and its completion must fit the model's context and the KV
pool, and a prompt's cache retention must be one this engine keeps. The engine applies it at
submit; the API asks it for a default `max_tokens` and the OpenAPI document for its limits, so the
three can never disagree."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from radixserve.runtime.engine_client import EngineRefusal, RefusalKind


@dataclass(frozen=True)
class Admission:
    max_context_len: int
    vocab_size: int
    kv_capacity_tokens: int
    # `prompt_cache_retention` values it keeps: "24h" needs the disk tier (`--cache-dir`)
    retentions: tuple[str, ...] = ("in_memory",)

    @property
    def room(self) -> int:
        """Tokens a prompt and its completion may take together."""
        return min(self.max_context_len, self.kv_capacity_tokens)

    @property
    def max_new_tokens(self) -> int:
        """The most any request can ask for (a prompt is at least one token)."""
        return self.room - 1

    def check_prompt(self, ids: Sequence[int]) -> None:
        if not ids:
            raise EngineRefusal(RefusalKind.INVALID, "must contain at least one token", "prompt")
        if any(not 0 <= t < self.vocab_size for t in ids):
            raise EngineRefusal(RefusalKind.INVALID, f"token ids must be in [0, {self.vocab_size})", "prompt")

    def max_tokens(self, prompt_len: int, requested: Optional[int], default: Optional[int] = None) -> int:
        """`requested` if prompt and completion fit; without one, `default` or else all the room the
        prompt leaves. Raises EngineRefusal (context_length) naming the field to shorten."""
        ctx = self.max_context_len
        if prompt_len >= self.room:
            limit = f"maximum context length is {ctx}" if ctx <= self.kv_capacity_tokens else \
                f"KV cache holds {self.kv_capacity_tokens}"
            raise EngineRefusal(RefusalKind.CONTEXT_LENGTH, f"This model's {limit} tokens, but the prompt has "
                                f"{prompt_len} tokens, leaving no room for a completion.", "prompt")
        if requested is None:
            return min(default, self.room - prompt_len) if default is not None else self.room - prompt_len
        if prompt_len + requested > ctx:
            raise EngineRefusal(RefusalKind.CONTEXT_LENGTH, f"This model's maximum context length is {ctx} tokens. "
                                f"However, you requested {prompt_len + requested} tokens ({prompt_len} in the "
                                f"prompt, {requested} in the completion). Please reduce the length of the prompt "
                                f"or of max_tokens.", "prompt")
        if prompt_len + requested > self.kv_capacity_tokens:
            raise EngineRefusal(RefusalKind.CONTEXT_LENGTH, f"prompt + max_tokens ({prompt_len + requested}) "
                                f"exceeds the KV cache of {self.kv_capacity_tokens} tokens", "max_tokens")
        return requested

    def fits(self, prompt_len: int, requested: Optional[int]) -> bool:
        """Whether `max_tokens` would accept this prompt length and completion."""
        try:
            self.max_tokens(prompt_len, requested)
        except EngineRefusal:
            return False
        return True

    def check_retention(self, retention: Optional[str]) -> None:
        if retention is not None and retention not in self.retentions:
            raise EngineRefusal(RefusalKind.INVALID, f"{retention!r} keeps prefixes on disk, and this server runs "
                                "without --cache-dir", "prompt_cache_retention")

    def check(self, ids: Sequence[int], max_tokens: int, retention: Optional[str] = None) -> None:
        """What submit asks of every request."""
        self.check_prompt(ids)
        self.max_tokens(len(ids), max_tokens)
        self.check_retention(retention)
