"""GrammarCompiler: off-thread compiles, LRU cache that remembers failures, timeout, cancellation,
shutdown. A real xgrammar backend over a small character vocabulary, wrapped to count (and, where
a test needs it, hold back) compiles."""
from __future__ import annotations

import threading
import time

import pytest

from radixserve.grammar import GrammarCompiler, GrammarError, GrammarSpec, VocabInfo, make_grammar_backend
from radixserve.grammar.backend import GrammarBackend

CHARS = [chr(c) for c in range(32, 127)]


class CountingBackend(GrammarBackend):
    """Delegates to a real backend; counts compiles; optionally waits for `gate` or sleeps first."""

    def __init__(self, inner: GrammarBackend, gate: threading.Event | None = None, delay_s: float = 0.0):
        super().__init__(inner.vocab)
        self.inner = inner
        self.name = inner.name
        self.supported_kinds = inner.supported_kinds
        self.gate = gate
        self.delay_s = delay_s
        self.compiled: list[GrammarSpec] = []

    def _compile(self, spec):
        self.compiled.append(spec)
        if self.gate is not None:
            self.gate.wait(10)
        time.sleep(self.delay_s)
        return self.inner.compile(spec)

    def matcher(self, compiled):
        return self.inner.matcher(compiled)


@pytest.fixture(scope="module")
def real_backend():
    vocab = VocabInfo(tokens=tuple(CHARS + ["</s>"]), vocab_type="raw", stop_token_ids=(len(CHARS),),
                      model_vocab_size=len(CHARS) + 1, special_token_ids=frozenset({len(CHARS)}))
    return make_grammar_backend("xgrammar", vocab)


@pytest.fixture
def make_compiler():
    compilers: list[GrammarCompiler] = []

    def build(backend, **kw) -> GrammarCompiler:
        compilers.append(GrammarCompiler(backend, **kw))
        return compilers[-1]
    yield build
    for compiler in compilers:
        compiler.shutdown()


def wait_done(handle, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while not handle.done():
        assert time.monotonic() < deadline, "handle never became done"
        time.sleep(0.005)
    return handle


def test_compiled_grammar_drives_a_matcher(real_backend, make_compiler):
    compiler = make_compiler(CountingBackend(real_backend))
    compiled = wait_done(compiler.submit(GrammarSpec.regex("ab+"))).result()
    matcher = real_backend.matcher(compiled)
    assert matcher.accept_token(CHARS.index("a")) and matcher.accept_token(CHARS.index("b"))
    assert not matcher.accept_token(CHARS.index("a"))


def test_cache_hit_returns_the_same_compiled_object(real_backend, make_compiler):
    backend = CountingBackend(real_backend)
    compiler = make_compiler(backend)
    first = compiler.compile(GrammarSpec.json_schema({"type": "object", "properties": {"a": {"type": "integer"}}}))
    # the same schema written with its keys in another order is the same cache entry
    again = compiler.compile(GrammarSpec.json_schema('{"properties": {"a": {"type": "integer"}}, "type": "object"}'))
    assert again is first
    assert len(backend.compiled) == 1


def test_failure_is_cached_and_not_recompiled(real_backend, make_compiler):
    backend = CountingBackend(real_backend)
    compiler = make_compiler(backend)
    for _ in range(3):
        with pytest.raises(GrammarError, match="regex: missing"):
            compiler.compile(GrammarSpec.regex("(ab"))
    assert len(backend.compiled) == 1
    assert compiler.cache_info()["failed"] == 1


def test_submit_returns_before_the_compile_finishes(real_backend, make_compiler):
    gate = threading.Event()
    compiler = make_compiler(CountingBackend(real_backend, gate=gate))
    start = time.monotonic()
    handle = compiler.submit(GrammarSpec.regex("a+"))
    assert time.monotonic() - start < 0.5
    assert not handle.done()
    gate.set()
    assert wait_done(handle).result() is not None


def test_concurrent_requests_for_one_spec_share_one_compile(real_backend, make_compiler):
    gate = threading.Event()
    backend = CountingBackend(real_backend, gate=gate)
    compiler = make_compiler(backend)
    first, second = compiler.submit(GrammarSpec.regex("x+")), compiler.submit(GrammarSpec.regex("x+"))
    gate.set()
    assert wait_done(first).result() is wait_done(second).result()
    assert len(backend.compiled) == 1


def test_slow_compile_times_out_with_a_named_error(real_backend, make_compiler):
    backend = CountingBackend(real_backend, delay_s=1.5)  # far past the deadline, even on a busy machine
    compiler = make_compiler(backend, timeout_s=0.1)
    handle = compiler.submit(GrammarSpec.regex("a|b"))
    start = time.monotonic()
    wait_done(handle)
    assert time.monotonic() - start < 1.0  # done at the deadline, not when the compile ends
    with pytest.raises(GrammarError, match="regex: grammar compilation timed out after 0.1 s"):
        handle.result()
    # the late result is remembered as the timeout: the same spec fails again without a compile
    time.sleep(1.6)
    with pytest.raises(GrammarError, match="timed out"):
        compiler.compile(GrammarSpec.regex("a|b"))
    assert len(backend.compiled) == 1


def test_cancelling_a_pending_compile_drops_it(real_backend, make_compiler):
    gate = threading.Event()
    backend = CountingBackend(real_backend, gate=gate)
    compiler = make_compiler(backend, max_workers=1)
    busy = compiler.submit(GrammarSpec.regex("busy"))
    pending = compiler.submit(GrammarSpec.regex("pending"))
    pending.cancel()
    assert pending.done() and pending.cancelled
    with pytest.raises(GrammarError, match="cancelled"):
        pending.result()
    gate.set()
    wait_done(busy).result()
    assert [s.payload for s in backend.compiled] == ["busy"]
    # a later request for the cancelled spec compiles it afresh
    assert compiler.compile(GrammarSpec.regex("pending")) is not None
    assert [s.payload for s in backend.compiled] == ["busy", "pending"]


def test_cancelling_one_waiter_keeps_the_compile_for_the_other(real_backend, make_compiler):
    gate = threading.Event()
    compiler = make_compiler(CountingBackend(real_backend, gate=gate), max_workers=1)
    busy = compiler.submit(GrammarSpec.regex("busy"))
    aborted, kept = compiler.submit(GrammarSpec.regex("y")), compiler.submit(GrammarSpec.regex("y"))
    aborted.cancel()
    gate.set()
    assert wait_done(kept).result() is not None
    wait_done(busy)


def test_least_recently_used_entry_is_evicted(real_backend, make_compiler):
    backend = CountingBackend(real_backend)
    compiler = make_compiler(backend, cache_size=2)
    for pattern in ("a", "b", "a", "c", "a", "b"):
        compiler.compile(GrammarSpec.regex(pattern))
    # "b" was least recently used when "c" came in, so only "b" is compiled twice
    assert [s.payload for s in backend.compiled] == ["a", "b", "c", "b"]


def test_shutdown_leaves_no_compile_threads(real_backend):
    before = set(threading.enumerate())  # engines of other tests may still be winding theirs down
    compiler = GrammarCompiler(CountingBackend(real_backend), max_workers=2)
    for pattern in ("a", "b", "c"):
        compiler.submit(GrammarSpec.regex(pattern))
    compiler.shutdown()
    assert not [t for t in set(threading.enumerate()) - before if t.name.startswith("grammar-compile")]
    with pytest.raises(RuntimeError, match="shut down"):
        compiler.submit(GrammarSpec.regex("d"))
