"""The Engine: one loop thread that owns the model, the KV cache and the radix tree.

Other threads talk to it only through `submit` (returns an OutputStream) and `abort`.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
import traceback
import uuid
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch

from radixserve.radix import KVPagePool, RequestPageTable
from radixserve.runtime.attention import make_attention_backend
from radixserve.runtime.config import EngineConfig
from radixserve.runtime.detokenizer import IncrementalDetokenizer
from radixserve.runtime.kv_cache import KVCache, kv_cache_tokens
from radixserve.runtime.kv_manager import KVManager
from radixserve.runtime.model_runner import ModelRunner
from radixserve.runtime.models.llama import LlamaForCausalLM
from radixserve.runtime.models.loader import ModelFiles, load_model_files
from radixserve.runtime.platform import get_platform, pick_device, pick_dtype
from radixserve.runtime.request import OutputStream, Request, RequestOutput, RequestStatus
from radixserve.runtime.sampler import Sampler
from radixserve.runtime.sampling_params import SamplingParams
from radixserve.runtime.scheduler import ScheduledBatch, Scheduler
from radixserve.runtime.structured_output import StructuredOutput

log = logging.getLogger("radixserve.engine")

Prompt = Union[str, Sequence[int]]


class EngineOverloadedError(RuntimeError):
    """The waiting queue is full; retry later (the API maps this to HTTP 503)."""


class EngineStoppedError(RuntimeError):
    """The engine was shut down, or stopped after failing (`Engine.health().fatal_error`)."""


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


@dataclass(frozen=True)
class EngineHealth:
    """Whether the engine can still serve, for `/health` and the server's watchdog."""
    alive: bool                     # the loop thread runs and has not given up
    seconds_since_progress: float   # since the loop last finished a step or an idle wait
    failed_steps: int               # consecutive failed steps (0 after any step that succeeds)
    fatal_error: Optional[str]      # why the engine stopped serving, once it has


# Messages to the loop thread (its inbox).
@dataclass
class _Add:
    req: Request


@dataclass
class _Abort:
    request_id: str


@dataclass
class _AbortAll:
    pass


@dataclass
class _Flush:
    done: threading.Event


@dataclass
class _CheckPages:
    done: threading.Event
    result: list  # the AssertionError, if the invariant is broken


@dataclass
class _Summarize:
    done: threading.Event
    limit: int
    result: list  # the PrefixSummary


@dataclass
class _Stop:
    pass


@dataclass(frozen=True)
class PrefixSummary:
    """What the radix tree holds, for a router: `radix.prefix_hash` hashes of its page-aligned
    prefixes, most recently used first, and whether the limit left some out."""
    page_size: int
    hashes: list[int]
    truncated: bool


@dataclass
class CompletionResult:
    """A whole finished request, as `generate` returns it."""
    request_id: str
    text: str
    token_ids: list[int]
    finish_reason: str
    prompt_tokens: int
    cached_tokens: int
    logprobs: list


class Engine:
    def __init__(self, config: Optional[EngineConfig] = None, model_files: Optional[ModelFiles] = None):
        self.config = config = config or EngineConfig()
        config.validate()
        files = model_files or load_model_files(config.model)
        self.model_name = files.name
        self.tokenizer = files.tokenizer
        self.model_config = files.config
        self.device = pick_device(config.device)
        self.platform = get_platform(self.device)
        self.dtype = pick_dtype(config.dtype, self.device)
        self.eos_token_ids = sorted(set(files.config.eos_token_ids) | set(self.tokenizer.eos_token_ids))

        self.structured = StructuredOutput(config.grammar_backend, self.tokenizer, files.config.vocab_size,
                                           self.eos_token_ids, config.max_running_requests,
                                           config.grammar_compile_timeout, self.platform.pin_host_buffers,
                                           any_whitespace=config.grammar_any_whitespace)
        self._grammar_pending: list[Request] = []  # engine thread only: waiting for their grammar
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._requests: dict[str, Request] = {}    # submitted and not yet finished (guarded by _lock)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.steps = 0
        self.failed_steps = 0                      # consecutive
        self.fatal_error: Optional[str] = None     # set once the loop gives up
        self._progress_at = time.monotonic()       # the loop finished a step or an idle wait
        self.generation_tokens = 0
        self.last_step_seconds = 0.0
        self.last_batch_size = 0
        self.platform.prepare_process()  # before the loop thread exists (e.g. it shares malloc's arena)
        # The loop thread builds the model as well as running it: a second thread doing torch work
        # gets its own OpenMP team, and two teams on these few cores make every step ~1.6x slower.
        ready = threading.Event()
        failure: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, args=(files, ready, failure),
                                        name="radixserve-engine", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            raise failure[0]

    def _build(self, files: ModelFiles) -> None:
        config, mc, p = self.config, files.config, self.config.page_size
        # `--dtype float32` asked for by name is the reference: the dequantised weights everywhere.
        # Otherwise small batches may run on the block-quantized forms of a GGUF file's weights, as
        # the file states them (3-6x fewer bytes a step than float32).
        quantized = {} if config.dtype == "float32" else files.quantized
        self.model = LlamaForCausalLM(mc, files.weights, self.dtype, self.device, quantized)
        num_tokens = kv_cache_tokens(config, mc, self.dtype, self.platform.free_memory_bytes())
        self.pool = KVPagePool(num_tokens // p, p)
        self.kv_cache = KVCache(mc.num_layers, self.pool.num_pages, p, mc.num_kv_heads, mc.head_dim,
                                self.dtype, self.device)
        table = RequestPageTable(config.max_running_requests, -(-mc.max_context_len // p), self.device)
        self.kv = KVManager(self.pool, table, radix_enabled=not config.disable_radix_cache)
        self.scheduler = Scheduler(config, self.kv)
        attention = make_attention_backend(config.attention_backend, self.kv_cache, table.table, mc.num_heads)
        self.runner = ModelRunner(self.model, attention, p, self.kv_cache.pad_page, self.device)
        if self.platform.decode_graphs and not config.disable_cuda_graph and attention.supports_decode_graphs:
            self.runner.enable_decode_graphs(config.max_running_requests, mc.max_context_len)
            # capture wrote dummy K/V into the padding page (replays keep doing so for padding rows;
            # the Triton kernels never read it): zeroed, as the KV cache promises, after start-up
            self.kv_cache.k[:, self.kv_cache.pad_page].zero_()
            self.kv_cache.v[:, self.kv_cache.pad_page].zero_()
        self.sampler = Sampler(mc.vocab_size, self.eos_token_ids, seed=config.seed)
        self.platform.warm_up_kernels(mc.vocab_size)

    def _run(self, files: ModelFiles, ready: threading.Event, failure: list) -> None:
        try:
            self._build(files)
        except BaseException as e:  # reported to the constructor's caller
            failure.append(e)
            ready.set()
            return
        ready.set()
        self._loop()

    @property
    def kv_capacity_tokens(self) -> int:
        return self.pool.num_slots

    # ---- thread-safe API ----------------------------------------------------
    def submit(self, prompt: Prompt, params: Optional[SamplingParams] = None,
               request_id: Optional[str] = None) -> OutputStream:
        """Validate and queue a request; raises ValueError (bad input) or EngineOverloadedError."""
        if self._stop.is_set():
            raise EngineStoppedError("engine is shut down")
        params = params or SamplingParams()
        params.validate(self.model_config.vocab_size)
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        self._check_prompt(ids, params)
        rid = request_id or uuid.uuid4().hex
        stream = OutputStream(rid)
        req = Request(rid, ids, params, stream)
        req.detok = IncrementalDetokenizer(self.tokenizer, ids, params.stop, params.skip_special_tokens)
        if params.constraint is not None:
            self.structured.start(req)  # an unsupported kind raises here; compile errors arrive later
        try:
            with self._lock:
                # checked under the lock: once shutdown has begun, nothing new gets in
                if self._stop.is_set():
                    raise EngineStoppedError("engine is shut down")
                if rid in self._requests:
                    raise ValueError(f"request_id {rid!r} is already in use")
                if len(self._requests) >= self.config.max_waiting_requests + self.config.max_running_requests:
                    raise EngineOverloadedError("server overloaded: too many requests waiting")
                self._requests[rid] = req
                self._inbox.put(_Add(req))
        except BaseException:
            if req.grammar is not None:
                req.grammar.cancel()
            raise
        return stream

    def _check_prompt(self, ids: list[int], params: SamplingParams) -> None:
        ctx = self.model_config.max_context_len
        if not ids:
            raise ValueError("prompt: must contain at least one token")
        vocab = self.model_config.vocab_size
        if any(not 0 <= t < vocab for t in ids):
            raise ValueError(f"prompt: token ids must be in [0, {vocab})")
        if len(ids) >= ctx:
            raise ValueError(f"prompt: {len(ids)} tokens is longer than the model context ({ctx} tokens)")
        if len(ids) + params.max_tokens > ctx:
            raise ValueError(f"max_tokens: prompt ({len(ids)}) + max_tokens ({params.max_tokens}) "
                             f"exceeds the model context of {ctx} tokens")
        if len(ids) + params.max_tokens > self.kv_capacity_tokens:
            raise ValueError(f"max_tokens: prompt + max_tokens ({len(ids) + params.max_tokens}) exceeds the KV "
                             f"cache of {self.kv_capacity_tokens} tokens")

    def stats(self) -> EngineStats:
        """Thread-safe enough for metrics: every field is one read of an int the loop updates."""
        sched, pool, kv = self.scheduler, self.pool, self.kv
        return EngineStats(
            num_running=len(sched.running), num_waiting=len(sched.waiting),
            kv_cache_usage=1.0 - pool.num_free / pool.num_pages,
            prefix_cache_queried_tokens=sched.stats.prompt_tokens,
            prefix_cache_hit_tokens=sched.stats.cache_hit_tokens,
            prompt_tokens=sched.stats.prompt_tokens, generation_tokens=self.generation_tokens,
            preemptions=sched.stats.preemptions, evicted_tokens=kv.evicted_tokens,
            kv_pages_used=kv.pages_used, kv_pages_cached=kv.pages_cached, kv_pages_free=kv.pages_free,
            last_step_seconds=self.last_step_seconds, last_batch_size=self.last_batch_size)

    async def start(self, prompt: Prompt, params: Optional[SamplingParams] = None,
                    request_id: Optional[str] = None) -> OutputStream:
        """`submit` for asyncio callers (the API): an engine client on another process awaits the
        replica's acceptance here; this one accepts or refuses at once."""
        return self.submit(prompt, params, request_id)

    def prefix_summary(self, limit: int) -> PrefixSummary:
        """The radix tree's page hashes (at most `limit`), read by the loop thread between steps;
        blocks until then."""
        self._ensure_running()
        done = threading.Event()
        result: list = []
        self._inbox.put(_Summarize(done, limit, result))
        while not done.wait(0.5):  # the loop may stop before it gets to the message
            self._ensure_running()
        if not result:
            raise EngineStoppedError("engine is shut down")
        return result[0]

    def abort(self, request_id: str) -> None:
        self._inbox.put(_Abort(request_id))

    def abort_all(self) -> None:
        """End every request now with finish_reason "abort" (their text so far is kept)."""
        self._inbox.put(_AbortAll())

    def health(self) -> EngineHealth:
        alive = self._thread.is_alive() and self.fatal_error is None and not self._stop.is_set()
        return EngineHealth(alive, time.monotonic() - self._progress_at, self.failed_steps, self.fatal_error)

    def generate(self, prompts: Union[Prompt, Sequence[Prompt]],
                 params: Union[SamplingParams, Sequence[SamplingParams], None] = None) -> list[CompletionResult]:
        """Offline use: run all prompts through the batch and return whole results in order."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        streams = [self.submit(p, sp) for p, sp in zip(prompts, params)]
        return [collect(s) for s in streams]

    def flush_cache(self) -> None:
        """Drop all cached prefixes once the engine is idle (blocks until it is)."""
        self._ensure_running()
        done = threading.Event()
        self._inbox.put(_Flush(done))
        done.wait()

    def check_idle_invariant(self) -> None:
        """Raise unless every page is free or in the tree (call when no request is in flight)."""
        self._ensure_running()
        done = threading.Event()
        result: list = []
        self._inbox.put(_CheckPages(done, result))
        done.wait()
        if result:
            raise result[0]

    def _ensure_running(self) -> None:
        if self._stop.is_set() or not self._thread.is_alive():
            raise EngineStoppedError("engine is shut down")

    def shutdown(self) -> None:
        with self._lock:
            self._stop.set()
        self._inbox.put(_Stop())
        self._thread.join(timeout=30)
        self.structured.shutdown()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()

    # ---- the loop -------------------------------------------------------------
    def _loop(self) -> None:
        was_idle = True
        self._progress_at = time.monotonic()
        try:
            while not self._stop.is_set():
                try:
                    was_idle = self._iterate(was_idle)
                except Exception as e:  # outside a step: the queues may be inconsistent, so end everything
                    log.error("engine loop failed: %s\n%s", e, traceback.format_exc())
                    self._end_all("error", error=f"internal error: {e}", error_kind="internal")
                self._progress_at = time.monotonic()
        except BaseException as e:  # the thread itself is ending (e.g. SystemExit raised into it)
            self.fatal_error = f"the engine loop thread died: {type(e).__name__}: {e}"
            log.critical("%s\n%s", self.fatal_error, traceback.format_exc())
        if self.fatal_error is not None:
            self._end_all("error", error=f"internal error: {self.fatal_error}", error_kind="internal")
        self._end_all("abort")

    def _iterate(self, was_idle: bool) -> bool:
        """One pass of the loop; returns whether the engine was idle."""
        idle = not self.scheduler.has_work()
        if idle and not was_idle:
            self._check_pages_when_idle()
        # while grammars compile, wake up often to see whether they are ready
        self._drain_inbox(timeout=(0.005 if self._grammar_pending else 0.5) if idle else None)
        if self._stop.is_set():
            return idle
        if self._grammar_pending:
            self._admit_compiled()
        batch = self.scheduler.schedule()
        if batch is None:
            return idle
        try:
            t0 = time.perf_counter()
            self._step(batch)
            self.last_step_seconds, self.last_batch_size = time.perf_counter() - t0, len(batch.items)
            self.failed_steps = 0
            if log.isEnabledFor(logging.DEBUG):
                self._log_step(batch)
        except Exception as e:  # a bug or device error: fail the batch; keep serving unless it recurs
            self.failed_steps += 1
            log.error("engine step failed (%d in a row): %s\n%s", self.failed_steps, e, traceback.format_exc())
            for item in batch.items:
                if not item.req.is_finished:
                    self._finish(item.req, "error", error=f"internal error: {e}", error_kind="internal",
                                 cache=False)
            if self.platform.is_fatal(e) or self.failed_steps >= self.config.max_failed_steps:
                self.fatal_error = (f"{self.failed_steps} consecutive steps failed, the last with: "
                                    f"{type(e).__name__}: {e}")
                log.critical("the engine stops serving: %s", self.fatal_error)
                self._stop.set()
        return idle

    def _end_all(self, reason: str, error: Optional[str] = None, error_kind: Optional[str] = None) -> None:
        """Finish every submitted request, including those whose "add" is still in the inbox, so that
        no stream is left without a final output."""
        while True:  # release anyone blocked on a message the loop will not handle now
            try:
                message = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(message, (_Flush, _Summarize)):
                message.done.set()
            elif isinstance(message, _CheckPages):
                message.result.append(RuntimeError(f"engine requests ended ({reason})"))
                message.done.set()
        with self._lock:
            pending = list(self._requests.values())
        for req in pending:
            if req.is_finished:
                continue
            try:
                self._finish(req, reason, error=error, error_kind=error_kind, cache=False)
            except Exception:  # its stream has ended all the same (see _finish)
                log.error("could not release %s cleanly:\n%s", req.request_id, traceback.format_exc())

    def _log_step(self, batch: ScheduledBatch) -> None:
        kv = self.kv
        log.debug("step %d: %d decodes, %d prefill tokens in %d extends (%d admitted, %d cache-hit tokens, "
                  "%d held for sharing), %d waiting, pages used/cached/free %d/%d/%d, %.1f ms", self.steps,
                  len(batch.decodes), batch.prefill_tokens, len(batch.extends), batch.admitted,
                  batch.cache_hit_tokens, batch.held, len(self.scheduler.waiting), kv.pages_used,
                  kv.pages_cached, kv.pages_free, self.last_step_seconds * 1000)

    def _check_pages_when_idle(self) -> None:
        """Nothing runs, so every page must be free or in the tree, and nothing locked."""
        try:
            self.kv.check_invariant(self.scheduler.running)
        except AssertionError as e:
            log.error("KV PAGE INVARIANT BROKEN (pages leaked or double-owned): %s", e)

    def _admit_compiled(self) -> None:
        ready, failed = self.structured.poll(self._grammar_pending)
        for req in ready:
            self.scheduler.add(req)
        for req, message, kind in failed:
            self._finish(req, "error", error=message, error_kind=kind, cache=False)

    def _drain_inbox(self, timeout: Optional[float]) -> None:
        """Handle every queued message; wait up to `timeout` seconds for the first (None: no wait)."""
        while True:
            try:
                message = self._inbox.get(timeout=timeout) if timeout else self._inbox.get_nowait()
            except queue.Empty:
                return
            timeout = None
            if isinstance(message, _Add):
                if message.req.is_finished:  # an _AbortAll queued just before its _Add ended it
                    continue
                if message.req.grammar is not None:
                    self._grammar_pending.append(message.req)
                else:
                    self.scheduler.add(message.req)
            elif isinstance(message, (_Abort, _AbortAll)):
                with self._lock:
                    reqs = (list(self._requests.values()) if isinstance(message, _AbortAll)
                            else [self._requests.get(message.request_id)])
                for req in reqs:
                    if req is not None and not req.is_finished:
                        self._finish(req, "abort")
            elif isinstance(message, _Flush):
                if not self.scheduler.has_work():
                    self.kv.flush()
                message.done.set()
            elif isinstance(message, _CheckPages):
                try:
                    self.kv.check_invariant(self.scheduler.running)
                except AssertionError as e:
                    message.result.append(e)
                message.done.set()
            elif isinstance(message, _Summarize):
                hashes, truncated = self.kv.tree.page_hash_summary(message.limit)
                message.result.append(PrefixSummary(self.pool.page_size, hashes, truncated))
                message.done.set()
            elif isinstance(message, _Stop):
                return

    @torch.inference_mode()
    def _step(self, batch: ScheduledBatch) -> None:
        # Constrained rows last among decodes and first among extends (stable sorts): their logits
        # rows are then one block, which the bitmask is applied to in place, not gathered.
        batch.decodes.sort(key=lambda it: it.req.matcher is not None)
        batch.extends.sort(key=lambda it: it.req.matcher is None)
        sampling = [it.req for it in batch.items if it.samples]
        if self.platform.fill_mask_before_forward:
            mask_rows = self.structured.fill(sampling)
            logits = self.runner.forward(batch)
        else:  # the forward only queues kernels: the mask is filled on the host while they run
            logits = self.runner.forward(batch)
            mask_rows = self.structured.fill(sampling)
        self.structured.apply(logits, mask_rows)
        tokens, logprobs = self.sampler.sample(logits, sampling) if sampling else ([], [])
        self.steps += 1
        for item in batch.items:
            item.req.kv_len += item.num_tokens
        for item in batch.extends:
            self.kv.cache_prefix(item.req)  # later requests can reuse a prompt mid-prefill
        for req, tok, lp in zip(sampling, tokens, logprobs):
            self._commit(req, tok, lp)

    def _commit(self, req: Request, token: int, logprob) -> None:
        p = req.params
        req.append_token(token)
        if req.first_token_time is None:
            req.first_token_time = time.monotonic()
        self.generation_tokens += 1
        if logprob is not None:
            req.logprobs.append(logprob)
        n_out = len(req.output_ids)
        reason = None
        if req.matcher is not None:
            if not req.matcher.accept_token(token):
                self._finish(req, "error", error=f"internal error: the grammar rejected token {token}",
                             error_kind="internal")
                return
            if req.matcher.is_terminated():  # only a stop token ends a grammar: no text to add
                self._finish(req, "stop", token=token, logprob=logprob)
                return
        hit_stop_id = (token in p.stop_token_ids or (not p.ignore_eos and token in self.eos_token_ids))
        if hit_stop_id and n_out >= p.min_tokens:
            reason = "stop"
        else:
            req.detok.add_token(token)
            if req.detok.stopped and n_out >= p.min_tokens:
                reason = "stop"
        if reason is None and n_out >= p.max_tokens:
            reason = "length"
        if reason is None and req.num_tokens >= self.model_config.max_context_len:
            reason = "length"
        if reason is not None:
            self._finish(req, reason, token=token, logprob=logprob)
            return
        delta = req.detok.pop_delta()
        req.stream.put(RequestOutput(req.request_id, delta, [token], [logprob] if logprob else [],
                                     prompt_tokens=len(req.prompt_ids), completion_tokens=n_out,
                                     cached_tokens=req.cached_tokens))

    def _finish(self, req: Request, reason: str, token: Optional[int] = None, logprob=None,
                error: Optional[str] = None, error_kind: Optional[str] = None, cache: bool = True) -> None:
        req.finish_reason = reason
        req.status = RequestStatus.ABORTED if reason in ("abort", "error") else RequestStatus.FINISHED
        text = ""
        try:
            if req.grammar is not None:
                req.grammar.cancel()  # no-op once compiled; stops waiting for a compile in flight
                if req in self._grammar_pending:
                    self._grammar_pending.remove(req)
            req.grammar = req.matcher = None
            self.scheduler.remove(req, cache=cache)
            if reason != "error":
                text = req.detok.pop_delta(final=True)
        finally:  # whatever failed above, the stream gets its final output
            with self._lock:
                self._requests.pop(req.request_id, None)
            req.stream.put(RequestOutput(
                req.request_id, text, [token] if token is not None else [], [logprob] if logprob else [],
                finish_reason=reason, error=error, error_kind=error_kind, prompt_tokens=len(req.prompt_ids),
                time_to_first_token=(req.first_token_time - req.arrival_time) if req.first_token_time else None,
                completion_tokens=len(req.output_ids), cached_tokens=req.cached_tokens))


def collect(stream: OutputStream) -> CompletionResult:
    """Drain a stream into one result."""
    text, ids, lps = [], [], []
    last = None
    for out in stream.wait_finished():
        text.append(out.text)
        ids.extend(out.token_ids)
        lps.extend(out.logprobs)
        last = out
    return CompletionResult(stream.request_id, "".join(text), ids, last.finish_reason,
                            last.prompt_tokens, last.cached_tokens, lps)
