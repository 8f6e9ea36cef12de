"""The ingress's `EngineClient` (runtime/engine_client.py): tokenizer, admission rule, `start`,
`abort`, `health`, `stats`, backed by the engine replicas behind a Ray Serve deployment handle.

`start` sends an EngineCall through the handle as a stream and waits for the replica's first
reply, so that a refusal is raised here exactly as a local engine raises it (a 400 or a 503 before
any byte of the response). Aborting cancels the stream: Ray Serve cancels the replica's generator,
which aborts its engine request. A replica that dies mid-stream ends the stream with an error
output, which the API turns into an error chunk."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import AsyncIterator, Optional, Sequence, Union

from ray.exceptions import RayError, TaskCancelledError

from radixserve.api.cluster.protocol import Accepted, EngineCall, Refused, ReplicaInfo
from radixserve.api.cluster.view import CLUSTER
from radixserve.radix.prefix_hash import page_hashes, root_hash
from radixserve.runtime.admission import Admission
from radixserve.runtime.engine_client import EngineHealth, EngineRefusal, EngineStats, RefusalKind
from radixserve.runtime.models.loader import ModelFiles
from radixserve.runtime.request import RequestOutput
from radixserve.runtime.sampling_params import SamplingParams

log = logging.getLogger("radixserve.ingress")

PROBE_PERIOD_S = 2.0
PROBE_TIMEOUT_S = 30.0


class RemoteStream:
    """One engine request's outputs as they arrive from its replica (an `OutputSource`)."""

    def __init__(self, request_id: str, replica: str, responses):
        self.request_id = request_id
        self.replica = replica
        self._responses = responses

    def __aiter__(self) -> AsyncIterator[RequestOutput]:
        return self._aiter()

    async def _aiter(self) -> AsyncIterator[RequestOutput]:
        try:
            async for out in self._responses:
                yield out
                if out.finished:
                    return
        except TaskCancelledError:  # aborted (`RemoteEngine.abort`): end like a local abort
            yield RequestOutput(self.request_id, finish_reason="abort")
            return
        except RayError as e:
            log.error("request %s: engine replica %s failed: %s", self.request_id, self.replica, e)
            yield RequestOutput(self.request_id, finish_reason="error",
                                error=f"internal error: the engine replica failed ({type(e).__name__})")
            return
        # the replica's generator ended without a final output: it was shut down
        yield RequestOutput(self.request_id, finish_reason="error", error="internal error: the engine replica stopped")


class RemoteEngine:
    """The replicas as one `EngineClient`."""

    def __init__(self, handle, files: ModelFiles, info: ReplicaInfo, send_text: bool = False):
        self._probe_handle = handle
        self._handle = handle.options(stream=True)
        self.model_name = info.model_name
        self.tokenizer = files.tokenizer
        self.model_config = files.config
        self.page_size = info.page_size
        self.kv_capacity_tokens = info.kv_capacity_tokens
        self.admission = Admission(files.config.max_context_len, files.config.vocab_size, info.kv_capacity_tokens,
                                   info.retentions)
        self.device = info.device
        self.dtype = info.dtype
        self._send_text = send_text  # for a router that matches prompt text (bench/ray_router.py)
        self._live: dict[str, object] = {}  # request id -> its response generator, while it runs
        self._alive_at = time.monotonic()   # a replica last said its engine serves
        self._probe = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        """Ask some replica (the router's choice) every period whether its engine serves."""
        while True:
            try:
                health = await asyncio.wait_for(self._probe_handle.health.remote(), PROBE_TIMEOUT_S)
                if health.alive:
                    self._alive_at = time.monotonic()
                else:
                    log.warning("an engine replica reports it cannot serve: %s", health.fatal_error)
            except (RayError, asyncio.TimeoutError) as e:
                log.warning("no engine replica answered the health probe (%s)", type(e).__name__)
            await asyncio.sleep(PROBE_PERIOD_S)

    async def start(self, prompt: Union[str, Sequence[int]], params: Optional[SamplingParams] = None,
                    request_id: Optional[str] = None) -> RemoteStream:
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        params = params or SamplingParams()
        rid = request_id or f"req-{time.monotonic_ns()}"
        text = (prompt if isinstance(prompt, str) else self.tokenizer.decode(ids, skip_special_tokens=False)
                ) if self._send_text else ""
        call = EngineCall(rid, ids, params, page_hashes(ids, self.page_size, root_hash(params.cache_salt)), prompt=text)
        responses = self._handle.generate.remote(call)
        self._live[rid] = responses
        try:
            first = await responses.__anext__()
        except RayError as e:
            self._live.pop(rid, None)
            raise EngineRefusal(RefusalKind.STOPPED, f"the engine replica failed before accepting the request "
                                f"({type(e).__name__})") from None
        except BaseException:
            self._live.pop(rid, None)
            responses.cancel()
            raise
        if isinstance(first, Refused):
            self._live.pop(rid, None)
            raise first.refusal
        assert isinstance(first, Accepted), first
        return RemoteStream(rid, first.replica, _forget_when_done(self._live, rid, responses))

    def abort(self, request_id: str) -> None:
        responses = self._live.pop(request_id, None)
        if responses is not None:
            responses.cancel()

    def abort_all(self) -> None:
        for rid in list(self._live):
            self.abort(rid)

    def health(self) -> EngineHealth:
        """Progress is a replica saying its engine serves; none for longer than the watchdog
        timeout is a stall (Ray Serve itself replaces replicas whose check_health fails)."""
        return EngineHealth(not self._probe.done(), time.monotonic() - self._alive_at, 0,
                            None if not self._probe.done() else "the replica health probe stopped")

    def stats(self) -> EngineStats:
        """Sums over the replicas' latest reports."""
        reports = CLUSTER.reports()
        capacity = sum(r.kv_capacity_tokens for r in reports) or 1
        return EngineStats(
            num_running=sum(r.num_running for r in reports), num_waiting=sum(r.num_waiting for r in reports),
            kv_cache_usage=sum(r.kv_usage * r.kv_capacity_tokens for r in reports) / capacity,
            prefix_cache_queried_tokens=sum(r.prefix_queried_tokens for r in reports),
            prefix_cache_hit_tokens=sum(r.prefix_hit_tokens for r in reports),
            prompt_tokens=sum(r.prompt_tokens for r in reports),
            generation_tokens=sum(r.generation_tokens for r in reports), preemptions=0,
            kv_pages_used=sum(r.kv_pages_used for r in reports), kv_pages_cached=sum(r.kv_pages_cached for r in reports),
            kv_pages_free=sum(r.kv_pages_free for r in reports), forced_tokens=sum(r.forced_tokens for r in reports),
            window_pages=sum(r.window_pages for r in reports),
            window_pages_free=sum(r.window_pages_free for r in reports))

    def cached_prefixes(self, limit: int, by: str = "tokens", with_tokens: bool = False) -> list:
        """Each replica has its own tree, and the router sees only their page hashes: none listed."""
        return []

    def drop_prefixes(self, salt: Optional[str] = None, every_salt: bool = True) -> int:
        raise EngineRefusal(RefusalKind.INVALID, "with --replicas each replica has its own prefix cache; "
                            "flushing them from the ingress is not supported", "cache")

    def shutdown(self) -> None:
        self._probe.cancel()
        self.abort_all()


async def _forget_when_done(live: dict, rid: str, responses) -> AsyncIterator:
    try:
        async for item in responses:
            yield item
    finally:
        live.pop(rid, None)
