"""A request's state through its lifecycle, and the stream its outputs go to."""
from __future__ import annotations

import asyncio
import enum
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Optional

from radixserve.runtime.engine_client import EngineRefusal
from radixserve.runtime.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)  # (token id, logprob), best first


@dataclass
class RequestOutput:
    """One increment of a request's output; the last one carries `finish_reason`."""
    request_id: str
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: Optional[str] = None      # stop | length | abort | error
    error: Optional[str] = None              # why it ended with "error", for people
    refusal: Optional[EngineRefusal] = None  # set when the request itself was at fault (e.g. its grammar)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    forced_tokens: int = 0                   # of completion_tokens, appended by jump-forward (not sampled)
    time_to_first_token: Optional[float] = None  # seconds from submit, on the final output

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class OutputStream:
    """Thread-safe queue of RequestOutputs: iterate it blocking, or `async for` it."""
    replica: Optional[str] = None   # the engine replica serving it: none in process

    def __init__(self, request_id: str):
        self.request_id = request_id
        self._items: deque[RequestOutput] = deque()
        self._cond = threading.Condition()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        self._done = False
        self._final_only = False

    def put(self, out: RequestOutput) -> None:
        with self._cond:
            self._items.append(out)
            if out.finished or not self._final_only:
                self._cond.notify_all()
            waiters = list(self._waiters)
        for loop, event in waiters:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # that consumer's event loop has closed: nobody is left to wake
                with self._cond:
                    if (loop, event) in self._waiters:
                        self._waiters.remove((loop, event))

    def _pop(self) -> Optional[RequestOutput]:
        with self._cond:
            return self._items.popleft() if self._items else None

    def wait_finished(self) -> list[RequestOutput]:
        """Block until the request ends and return all its outputs. Unlike iterating, the waiting
        thread is woken once, not per token: with many requests in flight on few cores, per-token
        wake-ups of the consumer take CPU from the engine."""
        with self._cond:
            self._final_only = True
            while not (self._items and self._items[-1].finished):
                self._cond.wait()
            items = list(self._items)
            self._items.clear()
        self._done = True
        return items

    def __iter__(self):
        while not self._done:
            with self._cond:
                while not self._items:
                    self._cond.wait()
                out = self._items.popleft()
            self._done = out.finished
            yield out

    def __aiter__(self):
        return self._aiter()

    async def _aiter(self):
        loop, event = asyncio.get_running_loop(), asyncio.Event()
        with self._cond:
            self._waiters.append((loop, event))
        try:
            while not self._done:
                out = self._pop()
                if out is None:
                    await event.wait()
                    event.clear()
                    continue
                self._done = out.finished
                yield out
        finally:
            with self._cond:
                if (loop, event) in self._waiters:
                    self._waiters.remove((loop, event))


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    stream: OutputStream
    arrival_time: float = field(default_factory=time.monotonic)
    first_token_time: Optional[float] = None
    status: RequestStatus = RequestStatus.WAITING
    output_ids: list[int] = field(default_factory=list)
    # KV state: positions [0, kv_len) are computed; pages[i] holds positions [i*P, (i+1)*P)
    kv_len: int = 0
    pages: list[int] = field(default_factory=list)
    page_row: int = -1                     # row in RequestPageTable while running
    tree_node: Any = None                  # locked radix node covering positions [0, tree_len)
    tree_len: int = 0
    window_trimmed: int = 0                # its own pages before this one gave their window pages back
    cached_tokens: int = 0                 # prompt tokens served from the radix cache (first admission)
    disk_hit_tokens: int = 0               # of them, read back from the disk tier
    disk_load: Any = None                  # disk_tier.DiskLoad: pages read ahead while it waited
    first_admitted: bool = False
    preemptions: int = 0                   # times this request was preempted (it resumes from the tree)
    held_steps: int = 0                    # steps it waited for another request to prefill a shared prefix
    run_deferred: bool = False             # its forced run sat out the last step for a new prompt
    detok: Any = None                      # IncrementalDetokenizer
    finish_reason: Optional[str] = None
    logprobs: list[TokenLogprob] = field(default_factory=list)
    forced_tokens: int = 0                 # outputs its grammar forced (jump-forward), not sampled
    grammar: Any = None                    # grammar.CompileHandle while its grammar compiles
    matcher: Any = None                    # grammar.GrammarMatcher once compiled

    token_ids: list[int] = field(default_factory=list)   # prompt then outputs

    def __post_init__(self):
        self.token_ids = list(self.prompt_ids) + list(self.output_ids)

    def append_token(self, token_id: int) -> None:
        self.output_ids.append(token_id)
        self.token_ids.append(token_id)

    @property
    def priority(self) -> int:
        """Lower runs first under the `priority` policy."""
        return self.params.priority

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status in (RequestStatus.FINISHED, RequestStatus.ABORTED)
