"""What the HTTP side may ask of an engine, wherever it runs: the `EngineClient` protocol (the
in-process `Engine`, or the Ray Serve replicas' client), the one typed refusal every client raises,
and the snapshots it reports. The API maps refusals to HTTP in one place (api/errors.py)."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, AsyncIterator, Optional, Protocol, Sequence, Union

if TYPE_CHECKING:
    from radixserve.radix.page_store import StoreStats
    from radixserve.radix import CachedPrefix
    from radixserve.grammar.spec import GrammarError
    from radixserve.runtime.admission import Admission
    from radixserve.runtime.models.config import ModelConfig
    from radixserve.runtime.request import RequestOutput
    from radixserve.runtime.sampling_params import SamplingParams
    from radixserve.runtime.tokenizer import Tokenizer

Prompt = Union[str, Sequence[int]]


class RefusalKind(str, enum.Enum):
    INVALID = "invalid"                 # a field's value is wrong
    CONTEXT_LENGTH = "context_length"   # prompt + max_tokens do not fit the context or the KV pool
    GRAMMAR = "grammar"                 # the constraint is invalid or cannot be enforced
    OVERLOADED = "overloaded"           # the waiting queue is full: retry later
    STOPPED = "stopped"                 # the engine was shut down, or stopped after failing


class EngineRefusal(Exception):
    """A request the engine will not run, and why, as data: `field` names the SamplingParams
    field (or "prompt") at fault; a schema refusal adds the JSON Schema `keyword` refused and the
    JSON `pointer` to it in the schema as sent. `message` never repeats the field's name."""

    def __init__(self, kind: RefusalKind, message: str, field: Optional[str] = None,
                 keyword: Optional[str] = None, pointer: Optional[str] = None):
        super().__init__(message)
        self.kind = RefusalKind(kind)
        self.message = message
        self.field = field
        self.keyword = keyword
        self.pointer = pointer

    def __reduce__(self):  # crosses process boundaries (Ray replicas) with every field
        return type(self), (self.kind, self.message, self.field, self.keyword, self.pointer)

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message

    @classmethod
    def of_grammar(cls, error: "GrammarError") -> "EngineRefusal":
        return cls(RefusalKind.GRAMMAR, str(error), "constraint", getattr(error, "keyword", None),
                   getattr(error, "location", None))


@dataclass
class EngineStats:
    """A snapshot of the engine's load and totals since start-up, for `/metrics`."""
    num_running: int
    num_waiting: int
    kv_cache_usage: float           # share of KV pages held by running requests or the tree
    prefix_cache_queried_tokens: int
    prefix_cache_hit_tokens: int
    prompt_tokens: int
    generation_tokens: int
    preemptions: int
    evicted_tokens: int = 0         # cached tokens dropped from the radix tree to make room
    kv_pages_used: int = 0          # held by running requests outside the tree
    kv_pages_cached: int = 0        # owned by the radix tree
    kv_pages_free: int = 0
    last_step_seconds: float = 0.0  # wall time of the latest forward + sample + commit
    last_batch_size: int = 0        # requests in the latest step
    # prompt_cache_key -> (prompt tokens, of them served from the prefix cache), bounded
    cache_keys: dict[str, tuple[int, int]] = field(default_factory=dict)
    prefix_cache_disk_hit_tokens: int = 0   # of the hits, read back from the disk tier
    cache_dir: Optional[StoreStats] = None   # the disk tier's files and traffic (None: no --cache-dir)
    cache_dir_max_bytes: int = 0
    forced_tokens: int = 0          # of generation_tokens, appended by jump-forward without a step
    window_pages: int = 0           # the sliding-window layers' own pool (0: none)
    window_pages_free: int = 0


@dataclass(frozen=True)
class EngineHealth:
    """Whether the engine can still serve, for `/health` and the server's watchdog."""
    alive: bool                     # the loop thread runs and has not given up
    seconds_since_progress: float   # since the loop last finished a step or an idle wait
    failed_steps: int               # consecutive failed iterations (0 after any that succeeds)
    fatal_error: Optional[str]      # why the engine stopped serving, once it has


@dataclass(frozen=True)
class PrefixSummary:
    """What the radix tree holds, for a router: `radix.prefix_hash` hashes of its page-aligned
    prefixes, most recently used first, and whether the limit left some out."""
    page_size: int
    hashes: list[int]
    truncated: bool


class OutputSource(Protocol):
    """One request's outputs, the last with a `finish_reason`."""
    request_id: str
    replica: Optional[str]          # which engine replica serves it, where there are several

    def __aiter__(self) -> AsyncIterator["RequestOutput"]: ...


class EngineClient(Protocol):
    """The engine as the API sees it."""
    model_name: str
    tokenizer: "Tokenizer"
    model_config: "ModelConfig"
    admission: "Admission"       # the token-budget rule the engine applies, for defaults and docs

    async def start(self, prompt: Prompt, params: Optional["SamplingParams"] = None,
                    request_id: Optional[str] = None) -> OutputSource:
        """Queue a request; raises EngineRefusal before any output if it will not run."""
        ...

    def abort(self, request_id: str) -> None: ...

    def abort_all(self) -> None: ...

    def health(self) -> EngineHealth: ...

    def stats(self) -> EngineStats: ...

    def cached_prefixes(self, limit: int, by: str = "tokens", with_tokens: bool = False) -> list["CachedPrefix"]:
        """The top prefixes in the radix tree by tokens or hits (blocking: call it off the event
        loop); empty where there is no one tree to list (several replicas)."""
        ...

    def drop_prefixes(self, salt: Optional[str] = None, every_salt: bool = True) -> int:
        """Drop the cached prefixes no request holds, all or one salt's; the tokens dropped (blocking)."""
        ...

    def shutdown(self) -> None: ...
