"""The Engine: a thin facade over the loop thread that owns the model, the KV cache and the radix
tree (runtime/engine_loop.py), the admission rule (runtime/admission.py) and the output processor
(runtime/output_processor.py).

Other threads talk to it only through `submit` / `start` (a request's output stream), `abort`,
and queries answered between steps. It implements the API's `EngineClient`.
"""
from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Optional, Sequence, Union

from radixserve.radix import CachedPrefix, KVPagePool, RequestPageTable, WindowPages
from radixserve.radix.page_store import PageStore
from radixserve.runtime.admission import Admission
from radixserve.runtime.attention import make_attention_backend, make_split_attention
from radixserve.runtime.config import EngineConfig
from radixserve.runtime.detokenizer import IncrementalDetokenizer
from radixserve.runtime.disk_tier import RETENTIONS, DiskTier, cache_key
from radixserve.runtime.engine_client import (EngineHealth, EngineRefusal, EngineStats, Prompt, PrefixSummary,
                                              RefusalKind)
from radixserve.runtime.engine_loop import (Abort, AddRequest, CheckPages, EngineLoop, FlushCache, LiveRequests,
                                            DropPrefixes, ListPrefixes, LoopParts, SummarizePrefixes, stopped)
from radixserve.runtime.kv_cache import KVLayers, kv_cache_tokens, window_tokens
from radixserve.runtime.kv_manager import KVManager
from radixserve.runtime.model_runner import ModelRunner
from radixserve.runtime.models.llama import LlamaForCausalLM
from radixserve.runtime.models.loader import ModelFiles, load_model_files
from radixserve.runtime.models.quant import BlockTensor
from radixserve.runtime.output_processor import OutputProcessor
from radixserve.runtime.platform import get_platform, pick_device, pick_dtype
from radixserve.runtime.request import OutputStream, Request
from radixserve.runtime.sampler import Sampler
from radixserve.runtime.sampling_params import SamplingParams
from radixserve.runtime.scheduler import Scheduler
from radixserve.runtime.structured_output import StructuredOutput

__all__ = ["CompletionResult", "Engine", "EngineHealth", "EngineRefusal", "EngineStats", "PrefixSummary",
           "RefusalKind", "collect"]


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
    forced_tokens: int = 0   # of token_ids, appended by jump-forward


class Engine:
    def __init__(self, config: Optional[EngineConfig] = None, model_files: Optional[ModelFiles] = None):
        self.config = config = config or EngineConfig()
        config.validate()
        self.device = pick_device(config.device)
        self.platform = get_platform(self.device)   # chosen once, passed to everything below
        files = model_files or load_model_files(config.model)
        self.model_name = files.name
        self.tokenizer = files.tokenizer
        self.model_config = files.config
        self.dtype = pick_dtype(config.dtype, self.device,
                                block_quantized=any(isinstance(w, BlockTensor) for w in files.weights.values()))
        self.eos_token_ids = sorted(set(files.config.eos_token_ids) | set(self.tokenizer.eos_token_ids))
        self.structured = StructuredOutput(config.grammar_backend, self.tokenizer, files.config.vocab_size,
                                           self.eos_token_ids, config.max_running_requests,
                                           config.grammar_compile_timeout, self.platform,
                                           any_whitespace=config.grammar_any_whitespace,
                                           jump_forward=config.jump_forward)
        self.live = LiveRequests(config.max_waiting_requests + config.max_running_requests)
        self.platform.prepare_process()  # before the loop thread exists (e.g. it shares malloc's arena)
        self.loop = EngineLoop(config, self.live, self.structured, self.platform)
        parts = self.loop.start(lambda: self._build(files))
        self.scheduler, self.kv, self.runner, self.outputs = parts.scheduler, parts.kv, parts.runner, parts.outputs
        self.admission = Admission(files.config.max_context_len, files.config.vocab_size, self.pool.num_slots,
                                   RETENTIONS if self.kv.disk is not None else RETENTIONS[:1])
        # the weights move from the file's map to huge pages while the engine serves
        # (runtime/models/weight_memory.py); join() it to wait for them
        self.weight_pages: Optional[threading.Thread] = None
        if self.platform.weights_in_memory and not config.mmap and files.mapped is not None:
            self.weight_pages = threading.Thread(target=files.mapped.to_huge_pages, name="radixserve-weight-pages",
                                                 daemon=True)
            self.weight_pages.start()

    def _build(self, files: ModelFiles) -> LoopParts:
        """On the loop thread: the model, the KV pool and cache, and the loop's collaborators."""
        config, mc, p, platform = self.config, files.config, self.config.page_size, self.platform
        # `--dtype float32` asked for by name is the reference: the dequantised weights everywhere.
        # Otherwise a GGUF file's quantized matrices run on the block kernels as the file holds
        # them (3-7x fewer bytes a step than float32, and no float copy in memory).
        weights = files.dequantized() if config.dtype == "float32" else files.weights
        self.model = LlamaForCausalLM(mc, weights, self.dtype, platform)
        num_tokens = kv_cache_tokens(config, mc, self.dtype, platform.free_memory_bytes())
        self.pool = KVPagePool(num_tokens // p, p)
        window_slots = window_tokens(config, mc, self.pool.num_slots)
        window_pages = None if window_slots is None else window_slots // p
        self.windows = None if window_pages is None else WindowPages(self.pool.num_pages, window_pages, p, self.device)
        self.kv_cache = KVLayers.of(mc, self.pool.num_pages, window_pages, p, self.dtype, self.device)
        table = RequestPageTable(config.max_running_requests, -(-mc.max_context_len // p), self.device)
        disk = self._open_cache_dir(files) if config.cache_dir is not None else None
        kv = KVManager(self.pool, table, radix_enabled=not config.disable_radix_cache, disk=disk,
                       windows=self.windows, window=mc.sliding_window or 0)
        scheduler = Scheduler(config, kv)
        if self.windows is None:
            attention = make_attention_backend(config.attention_backend, self.kv_cache.full, table.table,
                                               mc.num_heads, platform, mc.sliding_window, mc.attention_sinks)
        else:
            attention = make_split_attention(config.attention_backend, self.kv_cache, table.table, self.windows,
                                             mc.num_heads, platform, mc.sliding_window, mc.attention_sinks)
        runner = ModelRunner(self.model, attention, table, p, self.kv_cache.full.pad_page, platform)
        if not config.disable_cuda_graph:
            runner.use_decode_graphs(config.max_running_requests, mc.max_context_len)
        sampler = Sampler(mc.vocab_size, self.eos_token_ids, seed=config.seed, platform=platform)

        def dummy_step() -> None:
            runner.warm_up()
            self.kv_cache.clear_pad_page()
        platform.warm_up_kernels(mc.vocab_size, dummy_step)
        outputs = OutputProcessor(scheduler, self.structured, self.live, self.eos_token_ids, mc.max_context_len)
        return LoopParts(scheduler, kv, runner, sampler, outputs)

    def _open_cache_dir(self, files: ModelFiles) -> DiskTier:
        p = self.config.page_size
        key = cache_key(files.weights, files.tokenizer, files.config, self.dtype, p)
        store = PageStore(self.config.cache_dir, key, p, DiskTier.page_bytes(self.kv_cache), self.config.cache_dir_size)
        return DiskTier(store, self.kv_cache, p, self.windows)

    @property
    def kv_capacity_tokens(self) -> int:
        return self.pool.num_slots

    @property
    def steps(self) -> int:
        return self.loop.steps

    # ---- thread-safe API ----------------------------------------------------
    def submit(self, prompt: Prompt, params: Optional[SamplingParams] = None,
               request_id: Optional[str] = None) -> OutputStream:
        """Validate and queue a request; raises EngineRefusal if it will not run."""
        if not self.loop.running:
            raise stopped(self.loop.fatal_error)
        params = params or SamplingParams()
        params.validate(self.model_config.vocab_size)
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        self.admission.check(ids, params.max_tokens, params.prompt_cache_retention)
        rid = request_id or uuid.uuid4().hex
        stream = OutputStream(rid)
        req = Request(rid, ids, params, stream)
        req.detok = IncrementalDetokenizer(self.tokenizer, ids, params.stop, params.skip_special_tokens)
        if params.constraint is not None:
            self.structured.start(req)  # an unsupported kind is refused here; compile errors arrive later
        try:
            self.live.add(req)
        except BaseException:
            self.structured.release(req)
            raise
        self.loop.send(AddRequest(req))
        return stream

    async def start(self, prompt: Prompt, params: Optional[SamplingParams] = None,
                    request_id: Optional[str] = None) -> OutputStream:
        """`submit` for asyncio callers (the API). What could block the event loop runs on a
        worker thread: tokenising a text prompt, and the grammar backend's first build (~1.5 s)."""
        constrained = params is not None and params.constraint is not None
        if isinstance(prompt, str) or (constrained and not self.structured.ready):
            return await asyncio.to_thread(self.submit, prompt, params, request_id)
        return self.submit(prompt, params, request_id)

    def abort(self, request_id: str) -> None:
        self.loop.send(Abort(request_id))

    def abort_all(self) -> None:
        """End every request now with finish_reason "abort" (their text so far is kept)."""
        self.loop.send(Abort())

    def generate(self, prompts: Union[Prompt, Sequence[Prompt]],
                 params: Union[SamplingParams, Sequence[SamplingParams], None] = None) -> list[CompletionResult]:
        """Offline use: run all prompts through the batch and return whole results in order."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        streams = [self.submit(p, sp) for p, sp in zip(prompts, params)]
        return [collect(s) for s in streams]

    def stats(self) -> EngineStats:
        """Thread-safe enough for metrics: every field is one read of an int the loop updates."""
        sched, pool, kv, loop = self.scheduler, self.pool, self.kv, self.loop
        return EngineStats(
            num_running=len(sched.running), num_waiting=len(sched.waiting),
            kv_cache_usage=1.0 - pool.num_free / pool.num_pages,
            prefix_cache_queried_tokens=sched.stats.prompt_tokens,
            prefix_cache_hit_tokens=sched.stats.cache_hit_tokens,
            prompt_tokens=sched.stats.prompt_tokens, generation_tokens=self.outputs.generation_tokens,
            preemptions=sched.stats.preemptions, evicted_tokens=kv.evicted_tokens,
            kv_pages_used=kv.pages_used, kv_pages_cached=kv.pages_cached, kv_pages_free=kv.pages_free,
            window_pages=0 if self.windows is None else self.windows.num_pages,
            window_pages_free=0 if self.windows is None else self.windows.num_free,
            last_step_seconds=loop.last_step_seconds, last_batch_size=loop.last_batch_size,
            # dict() copies in one C call, so the loop thread adding a key meanwhile cannot break it
            cache_keys={k: (v[0], v[1]) for k, v in dict(sched.stats.by_cache_key).items()},
            prefix_cache_disk_hit_tokens=sched.stats.disk_hit_tokens,
            cache_dir=None if kv.disk is None else dataclasses.replace(kv.disk.store.stats),
            cache_dir_max_bytes=0 if kv.disk is None else kv.disk.store.max_bytes,
            forced_tokens=self.structured.timings.forced_tokens)

    def health(self) -> EngineHealth:
        loop = self.loop
        alive = loop.running and loop.fatal_error is None
        return EngineHealth(alive, time.monotonic() - loop.progress_at, loop.failed_steps, loop.fatal_error)

    def prefix_summary(self, limit: int) -> PrefixSummary:
        """The radix tree's page hashes (at most `limit`), read by the loop between steps."""
        return self.loop.call(SummarizePrefixes(limit))

    def cached_prefixes(self, limit: int, by: str = "tokens", with_tokens: bool = False) -> list[CachedPrefix]:
        """The radix tree's top `limit` prefixes by tokens or hits, read by the loop between steps."""
        return self.loop.call(ListPrefixes(limit, by, with_tokens))

    def drop_prefixes(self, salt: Optional[str] = None, every_salt: bool = True) -> int:
        """Drop the cached prefixes no request holds (all, or one cache salt's); returns the tokens
        dropped. Prefixes running requests read stay."""
        return self.loop.call(DropPrefixes(salt, every_salt))

    def flush_cache(self) -> None:
        """Drop all cached prefixes once the engine is idle (blocks until the loop has answered)."""
        self.loop.call(FlushCache())

    def check_idle_invariant(self) -> None:
        """Raise unless every page is free or in the tree (call when no request is in flight)."""
        self.loop.call(CheckPages())

    def shutdown(self) -> None:
        self.loop.stop()
        self.structured.shutdown()
        if self.weight_pages is not None:   # a few seconds at most: no thread outlives the engine
            self.weight_pages.join()
        if self.kv.disk is not None:   # after the loop: nothing queues writes any more
            self.kv.disk.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()


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
                            last.prompt_tokens, last.cached_tokens, lps, last.forced_tokens)
