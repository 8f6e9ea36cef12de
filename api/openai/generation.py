"""The engine requests behind one API request: submit every choice, check the first output of a
constrained request before answering, merge the choices' streams, and abort whatever is still
running when the client goes away or anything fails."""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import AsyncIterator, Optional, Sequence

from fastapi.responses import JSONResponse
from starlette.requests import Request
from starlette.responses import Response

from radixserve.api.errors import RETRY_AFTER_SECONDS, APIError, internal_error
from radixserve.api.shell.metrics import RequestTimer, ServerMetrics
from radixserve.api.streaming import sse_response, until_disconnected
from radixserve.runtime.engine_client import EngineClient, OutputSource
from radixserve.runtime.request import RequestOutput, TokenLogprob
from radixserve.runtime.sampling_params import SamplingParams

log = logging.getLogger("radixserve.api")

REPLICA_HEADER = "x-radixserve-replica"


@dataclass
class Choice:
    """One engine request and what it has produced so far."""
    index: int
    request_id: str
    stream: OutputSource
    timer: RequestTimer
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    forced_tokens: int = 0
    finish_reason: Optional[str] = None
    error: Optional[str] = None
    text: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    _iterator: Optional[AsyncIterator[RequestOutput]] = None
    _first: Optional[RequestOutput] = None

    def record(self, out: RequestOutput) -> None:
        self.text.append(out.text)
        self.logprobs.extend(out.logprobs)
        self.timer.on_tokens(len(out.token_ids))
        self.prompt_tokens = out.prompt_tokens or self.prompt_tokens
        self.completion_tokens = out.completion_tokens
        self.cached_tokens = out.cached_tokens
        self.forced_tokens = out.forced_tokens
        if out.finished:
            self.finish_reason, self.error = out.finish_reason, out.error

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class Generation:
    """Submits and follows the engine requests (choices) of one API request. An engine refusal
    propagates as it is: the app maps it to HTTP with the request's field names (api/errors.py)."""

    def __init__(self, engine: EngineClient, metrics: ServerMetrics, request_id: str):
        self.engine = engine
        self.metrics = metrics
        self.request_id = request_id
        self.arrival = time.monotonic()
        self.choices: list[Choice] = []

    async def submit(self, prompt_ids: Sequence[int], params: SamplingParams) -> Choice:
        """Queue one more choice; on any refusal the choices already queued are aborted."""
        index = len(self.choices)
        rid = f"{self.request_id}-{index}"
        try:
            stream = await self.engine.start(list(prompt_ids), params, request_id=rid)
        except BaseException:
            self.abort()
            raise
        choice = Choice(index, rid, stream, RequestTimer(self.metrics, self.arrival), prompt_tokens=len(prompt_ids))
        self.choices.append(choice)
        return choice

    async def respond(self, http: Request, reply, stream: bool, constrained: bool) -> Response:
        """Answer with `reply` (its `chunks()` as SSE, or `whole()` as JSON) once a constrained
        request's grammars are accepted; whatever fails, the choices still running are aborted."""
        try:
            if constrained:
                await self.check_first_outputs(http)
            if stream:
                return self.tag(sse_response(reply.chunks(), on_close=self.abort))
            return self.tag(JSONResponse(await reply.whole(http)))
        except BaseException:
            self.abort()  # only choices still running
            raise

    def tag(self, response: Response) -> Response:
        """Name the engine replicas that serve the choices (`--replicas`; a local engine has none)."""
        replicas = [c.stream.replica for c in self.choices if c.stream.replica]
        if replicas:
            response.headers[REPLICA_HEADER] = ",".join(dict.fromkeys(replicas))
        return response

    async def check_first_outputs(self, http: Request) -> None:
        """Wait for each choice's first output: a grammar the engine rejects while compiling comes
        back as an error with no tokens, which is the client's 400, not a 200 that fails later."""
        async def first(choice: Choice) -> None:
            choice._iterator = choice.stream.__aiter__()
            choice._first = await choice._iterator.__anext__()

        await until_disconnected(http, asyncio.gather(*(first(c) for c in self.choices)), on_disconnect=self.abort)
        for c in self.choices:
            if c._first is not None and c._first.refusal is not None:
                for other in self.choices:
                    other.timer.finish("error")
                self.abort()
                raise c._first.refusal

    def check_whole(self) -> None:
        """Before a whole (non-streamed) reply: an engine failure is a 500. An abort the client did
        not ask for (the server is shutting down) still answers with the text so far, marked
        finish_reason "abort", unless nothing was generated: then it is a 503 to retry elsewhere."""
        for c in self.choices:
            if c.finish_reason == "error":
                log.error("request %s failed in the engine: %s", c.request_id, c.error)
                raise internal_error(c.request_id)
        if any(c.finish_reason == "abort" for c in self.choices) and not any(c.completion_tokens
                                                                            for c in self.choices):
            raise APIError(503, "the request was aborted before any token was generated: the server is "
                                "shutting down", code="aborted", headers={"Retry-After": str(RETRY_AFTER_SECONDS)})

    def record(self, choice: Choice, out: RequestOutput) -> Optional[dict]:
        """Record a streamed output; on an engine failure, the error event to send instead (the
        stream then ends)."""
        choice.record(out)
        if out.finish_reason != "error":
            return None
        log.error("request %s failed in the engine: %s", choice.request_id, out.error)
        choice.timer.finish("error")
        return internal_error(choice.request_id).body()

    async def outputs(self) -> AsyncIterator[tuple[Choice, RequestOutput]]:
        """Every choice's outputs, merged in arrival order; the caller records them."""
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(choice: Choice) -> None:
            try:
                iterator = choice._iterator or choice.stream.__aiter__()
                if choice._first is not None:
                    await queue.put((choice, choice._first))
                async for out in iterator:
                    await queue.put((choice, out))
            except asyncio.CancelledError:
                raise
            except Exception as e:  # handed to the consumer, which raises it
                queue.put_nowait((choice, e))

        tasks = [asyncio.create_task(pump(c)) for c in self.choices]
        remaining = len(self.choices)
        try:
            while remaining:
                choice, item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                if item.finished:
                    remaining -= 1
                yield choice, item
        finally:
            for t in tasks:
                t.cancel()
            self.abort()

    def abort(self) -> None:
        """Abort every choice that has not finished (the engine frees its pages within a step)."""
        for c in self.choices:
            if not c.finished:
                self.engine.abort(c.request_id)
                c.finish_reason = c.finish_reason or "abort"
                c.timer.finish("abort")

    # ---- totals for `usage` ----------------------------------------------------------------
    def usage(self, prompt_groups: Optional[list[list[Choice]]] = None) -> dict:
        """OpenAI usage: each prompt counted once, completions summed over choices. A prompt's
        cached_tokens is the least any of its choices got from the cache: what was already
        cached when the request arrived (the other choices then reuse the first's prefill)."""
        groups = prompt_groups or [self.choices]
        prompt = sum(g[0].prompt_tokens for g in groups if g)
        cached = sum(min(c.cached_tokens for c in g) for g in groups if g)
        completion = sum(c.completion_tokens for c in self.choices)
        # forced_tokens (an extension): completion tokens the grammar forced and jump-forward
        # appended without sampling; they count in completion_tokens as any other
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": cached},
                "completion_tokens_details": {"reasoning_tokens": 0,
                                              "forced_tokens": sum(c.forced_tokens for c in self.choices)}}
