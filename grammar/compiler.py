"""Grammar compilation off the engine thread: a small thread pool, an LRU cache keyed by
(kind, canonical spec text) that keeps failures too, a per-request timeout, and cancellation.

The engine calls `submit(spec)` when it admits a request and polls the returned handle each step
(`done()` never blocks); `cancel()` on abort. A compile cannot be interrupted once it runs (the
backends compile in native code), so a timed-out compile finishes in the background; its result
is then cached as the timeout failure, so the same spec fails fast next time.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
import queue
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from dataclasses import dataclass, field
from typing import Any

from radixserve.grammar.backend import GrammarBackend
from radixserve.grammar.spec import GrammarError, GrammarSpec


class _DaemonPool:
    """A few daemon worker threads running Futures. Not a ThreadPoolExecutor: Python joins its
    workers at exit, so one compile stuck in native code would keep the server from exiting."""

    def __init__(self, workers: int, name: str):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
                         for i in range(workers)]
        for t in self._threads:
            t.start()

    def submit(self, fn, *args) -> Future:
        future: Future = Future()
        self._jobs.put((future, fn, args))
        return future

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            future, fn, args = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as e:
                future.set_exception(e)

    def shutdown(self, wait: bool) -> None:
        """Cancel the jobs not started; workers stop after their current one (joined when `wait`)."""
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job[0].cancel()
        for _ in self._threads:
            self._jobs.put(None)
        if wait:
            for t in self._threads:
                t.join()


@dataclass
class _Entry:
    """One compile, shared by every handle asking for the same spec."""
    future: Future
    waiters: int = 0


@dataclass
class CompileHandle:
    """What `submit` returns: poll `done()`, then `result()`."""
    spec: GrammarSpec
    deadline: float
    timeout_s: float
    _entry: _Entry = field(repr=False)
    _compiler: "GrammarCompiler" = field(repr=False)
    _cancelled: bool = False

    def done(self) -> bool:
        """True once `result()` will not block: compiled, failed, timed out or cancelled."""
        return self._cancelled or self._entry.future.done() or time.monotonic() >= self.deadline

    def result(self, block: bool = False) -> Any:
        """The compiled grammar, or GrammarError (failure, timeout, cancellation). Without `block`
        it must only be called once `done()` is true."""
        if self._cancelled:
            raise GrammarError(f"{self.spec.kind}: grammar compilation was cancelled")
        future = self._entry.future
        if not future.done():
            remaining = self.deadline - time.monotonic()
            if block and remaining > 0:
                try:
                    return future.result(timeout=remaining)
                except FutureTimeoutError:
                    pass
                except CancelledError:
                    pass
            elif remaining > 0:
                raise RuntimeError("result() called before done()")
            if not future.done():
                raise GrammarError(f"{self.spec.kind}: grammar compilation timed out after {self.timeout_s:g} s")
        if future.cancelled():  # the compiler was shut down before this compile started
            raise GrammarError(f"{self.spec.kind}: grammar compilation was cancelled")
        return future.result()

    def cancel(self) -> None:
        """Stop waiting (request aborted). The compile itself is dropped if nobody else waits for
        it and it has not started yet."""
        if not self._cancelled:
            self._cancelled = True
            self._compiler._release(self)

    @property
    def cancelled(self) -> bool:
        return self._cancelled


class GrammarCompiler:
    def __init__(self, backend: GrammarBackend, max_workers: int = 2, cache_size: int = 256,
                 timeout_s: float = 30.0):
        self.backend = backend
        self.timeout_s = timeout_s
        self.cache_size = cache_size
        self._cache: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self._pool = _DaemonPool(max_workers, "grammar-compile")
        self._closed = False

    def submit(self, spec: GrammarSpec) -> CompileHandle:
        """Start compiling `spec` (or reuse the cached or in-flight compile of an equal spec)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("GrammarCompiler is shut down")
            entry = self._cache.get(spec.key)
            if entry is None:
                entry = _Entry(self._pool.submit(self._compile, spec))
                self._cache[spec.key] = entry
                self._evict()
            else:
                self._cache.move_to_end(spec.key)
            entry.waiters += 1
        return CompileHandle(spec, time.monotonic() + self.timeout_s, self.timeout_s, entry, self)

    def compile(self, spec: GrammarSpec) -> Any:
        """Blocking convenience: submit and wait (for tools and tests, not the engine loop)."""
        return self.submit(spec).result(block=True)

    def _compile(self, spec: GrammarSpec) -> Any:
        started = time.monotonic()
        try:
            compiled = self.backend.compile(spec)
        except GrammarError:
            raise
        except Exception as e:  # a backend bug must still reach the request as a named error
            raise GrammarError(f"{spec.kind}: compilation failed: {type(e).__name__}: {e}") from None
        if time.monotonic() - started > self.timeout_s:
            raise GrammarError(f"{spec.kind}: grammar compilation timed out after {self.timeout_s:g} s")
        return compiled

    def _evict(self) -> None:
        """Drop least recently used finished entries beyond cache_size (in-flight ones stay)."""
        excess = len(self._cache) - self.cache_size
        for key in list(self._cache):
            if excess <= 0:
                break
            if self._cache[key].future.done():
                del self._cache[key]
                excess -= 1

    def _release(self, handle: CompileHandle) -> None:
        with self._lock:
            entry = handle._entry
            entry.waiters -= 1
            if entry.waiters == 0 and entry.future.cancel():
                # never started: forget it so that a later request compiles afresh
                if self._cache.get(handle.spec.key) is entry:
                    del self._cache[handle.spec.key]

    def cache_info(self) -> dict[str, int]:
        with self._lock:
            done = [e.future for e in self._cache.values() if e.future.done()]
            failed = sum(1 for f in done if not f.cancelled() and f.exception() is not None)
            return {"entries": len(self._cache), "compiled": len(done) - failed, "failed": failed,
                    "pending": len(self._cache) - len(done)}

    def shutdown(self, wait: bool = True) -> None:
        """Cancel what has not started and stop the worker threads (joined when `wait`)."""
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=wait)

    def __enter__(self) -> "GrammarCompiler":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
