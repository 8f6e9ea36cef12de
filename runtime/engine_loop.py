"""The engine's loop thread: it alone touches the model, the KV pool and the radix tree. Other
threads reach it only through typed messages, each handled by one method; a step is schedule,
forward, mask and sample, commit.

A failure inside a step fails that step's requests; one outside a step (the queues may then be
inconsistent) ends every request. Either counts toward `max_failed_steps` consecutive failures,
after which the loop gives up: `/health` fails and the server exits for a supervisor to restart it.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from radixserve.radix import CachedPrefix
from radixserve.runtime.config import EngineConfig
from radixserve.runtime.engine_client import EngineRefusal, PrefixSummary, RefusalKind
from radixserve.runtime.kv_manager import KVManager
from radixserve.runtime.model_runner import ModelRunner
from radixserve.runtime.output_processor import OutputProcessor
from radixserve.runtime.platform import Platform
from radixserve.runtime.request import Request
from radixserve.runtime.sampler import Sampler
from radixserve.runtime.scheduler import ScheduledBatch, Scheduler
from radixserve.runtime.structured_output import StructuredOutput

log = logging.getLogger("radixserve.engine")

REPLY_POLL_SECONDS = 0.5   # how often a caller waiting on the loop checks that it still runs


def stopped(reason: Optional[str] = None) -> EngineRefusal:
    return EngineRefusal(RefusalKind.STOPPED, reason or "engine is shut down")


# ---- messages to the loop ----------------------------------------------------------------------
@dataclass
class Reply:
    """Where the loop answers a message another thread waits on (`EngineLoop.call`)."""
    done: threading.Event = field(default_factory=threading.Event)
    value: Any = None
    error: Optional[BaseException] = None

    def set(self, value: Any = None, error: Optional[BaseException] = None) -> None:
        self.value, self.error = value, error
        self.done.set()


@dataclass(frozen=True)
class AddRequest:
    """A submitted request joins the queue (once its grammar, if any, has compiled)."""
    req: Request


@dataclass(frozen=True)
class Abort:
    """End one request, or without an id every request, now with finish_reason "abort" (the text
    so far is kept)."""
    request_id: Optional[str] = None


@dataclass(frozen=True)
class FlushCache:
    """Drop all cached prefixes, if no request runs."""
    reply: Reply = field(default_factory=Reply)


@dataclass(frozen=True)
class CheckPages:
    """AssertionError unless every page is free or in the tree (no request in flight)."""
    reply: Reply = field(default_factory=Reply)


@dataclass(frozen=True)
class SummarizePrefixes:
    limit: int
    reply: Reply = field(default_factory=Reply)


@dataclass(frozen=True)
class ListPrefixes:
    """The top cached prefixes by tokens or hits, for the cache view; token ids only with `with_tokens`."""
    limit: int
    by: str = "tokens"
    with_tokens: bool = False
    reply: Reply = field(default_factory=Reply)


@dataclass(frozen=True)
class DropPrefixes:
    """Drop the cached prefixes no request holds: of every tenant, or only of `salt`'s."""
    salt: Optional[str] = None
    every_salt: bool = True
    reply: Reply = field(default_factory=Reply)


@dataclass(frozen=True)
class Stop:
    """Wake the loop to see that it must end."""


class LiveRequests:
    """Requests submitted and not yet ended, by id; any thread. Bounded: beyond `capacity` the
    engine is overloaded. Once closed (the loop is ending) nothing new gets in, so every request
    it holds is one the loop will end."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._by_id: dict[str, Request] = {}
        self._lock = threading.Lock()
        self._closed = False

    def add(self, req: Request) -> None:
        with self._lock:
            if self._closed:
                raise stopped()
            if req.request_id in self._by_id:
                raise EngineRefusal(RefusalKind.INVALID, f"{req.request_id!r} is already in use", "request_id")
            if len(self._by_id) >= self.capacity:
                raise EngineRefusal(RefusalKind.OVERLOADED, "server overloaded: too many requests waiting")
            self._by_id[req.request_id] = req

    def remove(self, request_id: str) -> None:
        with self._lock:
            self._by_id.pop(request_id, None)

    def get(self, request_id: str) -> Optional[Request]:
        with self._lock:
            return self._by_id.get(request_id)

    def all(self) -> list[Request]:
        with self._lock:
            return list(self._by_id.values())

    def close(self) -> None:
        with self._lock:
            self._closed = True


@dataclass
class LoopParts:
    """What the loop thread builds before it starts (a second thread doing torch work would get its
    own OpenMP team, and two teams on few cores make every step ~1.6x slower)."""
    scheduler: Scheduler
    kv: KVManager
    runner: ModelRunner
    sampler: Sampler
    outputs: OutputProcessor


class EngineLoop:
    def __init__(self, config: EngineConfig, live: LiveRequests, structured: StructuredOutput, platform: Platform):
        self.config, self.live, self.structured, self.platform = config, live, structured, platform
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self.steps = 0
        self.failed_steps = 0                   # consecutive failed iterations
        self.fatal_error: Optional[str] = None  # set once the loop gives up
        self.progress_at = time.monotonic()     # the loop finished a step or an idle wait
        self.last_step_seconds = 0.0
        self.last_batch_size = 0
        self._handlers: dict[type, Callable[[Any], Any]] = {
            AddRequest: self._on_add, Abort: self._on_abort,
            FlushCache: self._on_flush, CheckPages: self._on_check_pages, SummarizePrefixes: self._on_summarize,
            ListPrefixes: self._on_list_prefixes, DropPrefixes: self._on_drop_prefixes,
        }

    def start(self, build: Callable[[], LoopParts]) -> LoopParts:
        """Build the parts on the loop thread and start looping; raises what the build raised."""
        ready, built, failure = threading.Event(), [], []

        def run() -> None:
            try:
                parts = build()
            except BaseException as e:  # reported to the caller
                failure.append(e)
                ready.set()
                return
            self.scheduler, self.kv, self.runner, self.sampler, self.outputs = (
                parts.scheduler, parts.kv, parts.runner, parts.sampler, parts.outputs)
            built.append(parts)
            ready.set()
            self._loop()

        self.thread = threading.Thread(target=run, name="radixserve-engine", daemon=True)
        self.thread.start()
        ready.wait()
        if failure:
            self.thread.join()
            raise failure[0]
        return built[0]

    # ---- any thread -----------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return not self._stop.is_set() and self.thread is not None and self.thread.is_alive()

    def send(self, message: Any) -> None:
        self.inbox.put(message)

    def call(self, message: Any) -> Any:
        """Send a message that carries a Reply and wait for the answer; EngineRefusal (stopped) if
        the loop ends before it answers, whenever that happens."""
        if not self.running:
            raise stopped()
        self.inbox.put(message)
        while not message.reply.done.wait(REPLY_POLL_SECONDS):
            if not self.running:
                raise stopped()
        if message.reply.error is not None:
            raise message.reply.error
        return message.reply.value

    def stop(self) -> None:
        self._stop.set()
        self.live.close()
        self.inbox.put(Stop())
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout=30)

    # ---- the loop -------------------------------------------------------------------------------
    def _loop(self) -> None:
        was_idle = True
        self.progress_at = time.monotonic()
        try:
            while not self._stop.is_set():
                try:
                    was_idle = self._iterate(was_idle)
                except Exception as e:  # outside a step: the queues may be inconsistent, so end everything
                    self._failed("engine loop", e)
                    self._end_all("error", f"internal error: {e}")
                self.progress_at = time.monotonic()
        except BaseException as e:  # the thread itself is ending (e.g. SystemExit raised into it)
            self.fatal_error = f"the engine loop thread died: {type(e).__name__}: {e}"
            log.critical("%s\n%s", self.fatal_error, traceback.format_exc())
        self.live.close()
        if self.fatal_error is not None:
            self._end_all("error", f"internal error: {self.fatal_error}")
        self._end_all("abort")

    def _iterate(self, was_idle: bool) -> bool:
        """One pass of the loop; returns whether the engine was idle."""
        idle = not self.scheduler.has_work()
        if idle and not was_idle:
            self._check_pages_when_idle()
        # while grammars compile or pages are read from disk, wake up often to see whether they are ready
        disk = self.kv.disk
        waiting = self.structured.pending or (disk is not None and disk.pending)
        self._drain_inbox(timeout=(0.005 if waiting else 0.5) if idle else None)
        if self._stop.is_set():
            return idle
        if self.structured.pending:
            self._admit_compiled()
        if disk is not None and disk.pending:
            for req in disk.poll():
                if not req.is_finished:
                    self.scheduler.add(req)
        batch = self.scheduler.schedule()
        if batch is None or self._run_step(batch):
            self.failed_steps = 0
        return idle

    def _failed(self, where: str, e: Exception) -> None:
        """Count a failure; give up when the device is lost or failures keep coming."""
        self.failed_steps += 1
        log.error("%s failed (%d in a row): %s\n%s", where, self.failed_steps, e, traceback.format_exc())
        if self.platform.is_fatal(e) or self.failed_steps >= self.config.max_failed_steps:
            self.fatal_error = f"{self.failed_steps} consecutive steps failed, the last with: {type(e).__name__}: {e}"
            log.critical("the engine stops serving: %s", self.fatal_error)
            self._stop.set()

    def _run_step(self, batch: ScheduledBatch) -> bool:
        try:
            t0 = time.perf_counter()
            self._step(batch)
            self.last_step_seconds, self.last_batch_size = time.perf_counter() - t0, len(batch.items)
            if log.isEnabledFor(logging.DEBUG):
                self._log_step(batch)
            return True
        except Exception as e:  # a bug or device error: fail the batch; keep serving unless it recurs
            for item in batch.items:
                if not item.req.is_finished:
                    self.outputs.finish(item.req, "error", error=f"internal error: {e}", cache=False)
            self._failed("engine step", e)
            return False

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
        for item in batch.decodes:
            self.kv.advance(item.req, item.num_tokens, cache=False)
        for item in batch.extends:
            # a prompt's chunks enter the tree as they land; a run of forced output tokens
            # (jump-forward) is output, cached when the request ends, as decodes are
            prefill = item.req.kv_len < len(item.req.prompt_ids)
            self.kv.advance(item.req, item.num_tokens, cache=prefill)
        for req, token, logprob in zip(sampling, tokens, logprobs):
            self.outputs.commit(req, token, logprob)

    def _admit_compiled(self) -> None:
        ready, failed = self.structured.poll()
        for req in ready:
            self._queue(req)
        for req, message, refusal in failed:
            self.outputs.finish(req, "error", error=message, refusal=refusal, cache=False)

    def _end_all(self, reason: str, error: Optional[str] = None) -> None:
        """Finish every submitted request, including those whose AddRequest is still in the inbox, so
        that no stream is left without a final output; answer whoever waits on a message."""
        while True:
            try:
                message = self.inbox.get_nowait()
            except queue.Empty:
                break
            reply = getattr(message, "reply", None)
            if reply is not None:
                reply.set(error=stopped())
        for req in self.live.all():
            if req.is_finished:
                continue
            try:
                self.outputs.finish(req, reason, error=error, cache=False)
            except Exception:  # its stream has ended all the same (see OutputProcessor.finish)
                log.error("could not release %s cleanly:\n%s", req.request_id, traceback.format_exc())

    def _log_step(self, batch: ScheduledBatch) -> None:
        kv = self.kv
        log.debug("step %d: %d decodes, %d prefill tokens in %d extends (%d admitted, %d cache-hit tokens, "
                  "%d held for sharing), %d waiting, pages used/cached/free %d/%d/%d, %.1f ms", self.steps,
                  len(batch.decodes), batch.prefill_tokens, len(batch.extends), batch.admitted,
                  batch.cache_hit_tokens, len(batch.held), len(self.scheduler.waiting), kv.pages_used,
                  kv.pages_cached, kv.pages_free, self.last_step_seconds * 1000)

    def _check_pages_when_idle(self) -> None:
        """Nothing runs, so every page must be free or in the tree, and nothing locked."""
        try:
            self.kv.check_invariant(self.scheduler.running)
        except AssertionError as e:
            log.error("KV PAGE INVARIANT BROKEN (pages leaked or double-owned): %s", e)

    # ---- one handler per message ----------------------------------------------------------------
    def _drain_inbox(self, timeout: Optional[float]) -> None:
        """Handle every queued message; wait up to `timeout` seconds for the first (None: no wait)."""
        while True:
            try:
                message = self.inbox.get(timeout=timeout) if timeout else self.inbox.get_nowait()
            except queue.Empty:
                return
            timeout = None
            if isinstance(message, Stop):
                return
            reply = getattr(message, "reply", None)
            if reply is None:
                self._handlers[type(message)](message)
                continue
            try:  # a query's failure is its caller's to see
                reply.set(self._handlers[type(message)](message))
            except Exception as e:
                reply.set(error=e)

    def _on_add(self, m: AddRequest) -> None:
        if m.req.is_finished:  # an Abort of all queued just before its AddRequest ended it
            return
        if m.req.grammar is not None:
            self.structured.wait_for(m.req)
        else:
            self._queue(m.req)

    def _queue(self, req: Request) -> None:
        """Into the waiting queue; first, where its prompt continues on disk, read those pages."""
        disk = self.kv.disk
        if disk is None or not disk.read_ahead(req, self.kv.disk_read_start(req), self.kv.pool.num_pages):
            self.scheduler.add(req)

    def _on_abort(self, m: Abort) -> None:
        for req in self.live.all() if m.request_id is None else [self.live.get(m.request_id)]:
            if req is not None and not req.is_finished:
                self.outputs.finish(req, "abort")

    def _on_flush(self, _: FlushCache) -> None:
        if not self.scheduler.has_work():
            self.kv.flush()

    def _on_check_pages(self, _: CheckPages) -> None:
        self.kv.check_invariant(self.scheduler.running)

    def _on_list_prefixes(self, m: ListPrefixes) -> list[CachedPrefix]:
        return self.kv.tree.top_prefixes(m.limit, m.by, m.with_tokens)

    def _on_drop_prefixes(self, m: DropPrefixes) -> int:
        return self.kv.drop_unused(m.salt, m.every_salt)

    def _on_summarize(self, m: SummarizePrefixes) -> PrefixSummary:
        hashes, truncated = self.kv.tree.page_hash_summary(m.limit)
        return PrefixSummary(self.kv.page_size, hashes, truncated)
