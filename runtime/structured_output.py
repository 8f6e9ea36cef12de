"""Structured output on the engine side: compile each request's grammar off-thread, then every step
fill the bitmask rows of the constrained requests and apply them to the logits in one call.

The grammar backend is built on the first constrained request, so engines that never see one do
not pay for importing xgrammar or indexing the vocabulary.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from radixserve.grammar import GrammarBackend, GrammarCompiler, GrammarError, GrammarSpec, make_grammar_backend
from radixserve.grammar.jump_forward import ForcedTokens
from radixserve.kernels.bitmask import apply_token_bitmask_
from radixserve.runtime.engine_client import EngineRefusal
from radixserve.runtime.platform import HostStaging, Platform, get_platform
from radixserve.runtime.request import Request
from radixserve.runtime.tokenizer import Tokenizer


@dataclass
class MaskTimings:
    """Totals since start-up, for the structured-output benchmark and the metrics."""
    steps: int = 0
    rows: int = 0
    fill_s: float = 0.0
    apply_s: float = 0.0
    forced_runs: int = 0       # jump-forward: times forced tokens were appended
    forced_tokens: int = 0     # tokens appended so, each one a decode step saved
    forced_s: float = 0.0      # finding and tokenizing forced strings, accepting their tokens


class StructuredOutput:
    def __init__(self, backend_name: str, tokenizer: Tokenizer, model_vocab_size: int,
                 stop_token_ids: Sequence[int], max_rows: int, compile_timeout_s: float,
                 platform: Optional[Platform] = None, any_whitespace: bool = False, jump_forward: bool = True):
        """`platform`: the engine's, which stages the bitmask for its device (the CPU's without one)."""
        self.backend_name = backend_name
        self.any_whitespace = any_whitespace
        self.jump_forward = jump_forward
        self._forced: Optional[ForcedTokens] = None
        self._tokenizer = tokenizer
        self._vocab_size = model_vocab_size
        self._stop_ids = tuple(stop_token_ids)
        self._max_rows = max_rows
        self._timeout = compile_timeout_s
        self._platform = platform or get_platform(torch.device("cpu"))
        self._staging: Optional[HostStaging] = None
        self._lock = threading.Lock()
        self.backend: Optional[GrammarBackend] = None
        self.compiler: Optional[GrammarCompiler] = None
        self.timings = MaskTimings()
        self.pending: list[Request] = []   # engine thread only: waiting for their grammar

    def _ensure_backend(self) -> GrammarBackend:
        with self._lock:
            if self.backend is None:
                vocab = self._tokenizer.vocab_info(self._vocab_size, extra_stop_ids=self._stop_ids)
                backend = make_grammar_backend(self.backend_name, vocab, any_whitespace=self.any_whitespace)
                # one allocation, reused every step
                self._staging = self._platform.staging(
                    backend.allocate_bitmask(self._max_rows, pin_memory=self._platform.pin_host_buffers))
                self.compiler = GrammarCompiler(backend, timeout_s=self._timeout)
                self._forced = ForcedTokens(lambda text: self._tokenizer.encode(text, add_special_tokens=False),
                                            vocab.token_bytes)
                self.backend = backend
            return self.backend

    # ---- any thread -----------------------------------------------------------
    @property
    def ready(self) -> bool:
        """The backend is built: `start` no longer blocks (the first build imports the backend and
        indexes the vocabulary, ~1.5 s for xgrammar)."""
        return self.backend is not None

    def start(self, req: Request) -> None:
        """Check the kind is supported (EngineRefusal now) and start compiling (errors come later)."""
        spec: GrammarSpec = req.params.constraint
        try:
            self._ensure_backend().check_supported(spec)
        except GrammarError as e:
            raise EngineRefusal.of_grammar(e) from None
        req.grammar = self.compiler.submit(spec)

    # ---- engine thread --------------------------------------------------------
    def wait_for(self, req: Request) -> None:
        """Hold a request until its grammar has compiled (`poll` hands it back)."""
        self.pending.append(req)

    def release(self, req: Request) -> None:
        """A request ends: stop compiling for it, drop its matcher."""
        if req.grammar is not None:
            req.grammar.cancel()  # no-op once compiled; stops waiting for a compile in flight
            if req in self.pending:
                self.pending.remove(req)
        req.grammar = req.matcher = None

    def poll(self) -> tuple[list[Request], list[tuple[Request, str, Optional[EngineRefusal]]]]:
        """Pending requests whose grammars are done: (ready with their matchers, failed with a
        message and, when the grammar is at fault, the refusal); the rest stay pending."""
        ready, failed, still = [], [], []
        for req in self.pending:
            if not req.grammar.done():
                still.append(req)
                continue
            try:
                req.matcher = self.backend.matcher(req.grammar.result())
                ready.append(req)
            except GrammarError as e:
                refusal = EngineRefusal.of_grammar(e)
                failed.append((req, str(refusal), refusal))
            except Exception as e:  # a backend bug: this request fails, the engine keeps going
                failed.append((req, f"internal error: grammar matcher: {e}", None))
        self.pending = still
        return ready, failed

    def fill(self, reqs: Sequence[Request]) -> list[int]:
        """Fill the bitmask rows of the constrained requests among `reqs` (row i is reqs[i]);
        returns those rows, for `apply`."""
        rows = [i for i, r in enumerate(reqs) if r.matcher is not None]
        if rows:
            t0 = time.perf_counter()
            self.backend.fill_bitmask([reqs[i].matcher for i in rows], self._staging.writable(), rows)
            self.timings.fill_s += time.perf_counter() - t0
        return rows

    def apply(self, logits: torch.Tensor, rows: list[int]) -> None:
        """Mask those logits rows with their filled bitmask rows, in one call."""
        if not rows:
            return
        t0 = time.perf_counter()
        # rows ascend: only the bitmask rows up to the last one in use cross to the device
        bitmask = self._staging.upload(rows[-1] + 1)
        apply_token_bitmask_(logits, bitmask, self._platform.row_index(rows), vocab_size=self._vocab_size)
        tm = self.timings
        tm.apply_s += time.perf_counter() - t0
        tm.steps += 1
        tm.rows += len(rows)

    def force(self, req: Request, limit: int) -> list[int]:
        """Jump-forward: the tokens `req`'s grammar forces next (at most `limit`), already accepted by
        its matcher; [] where the next token is the model's choice."""
        if not self.jump_forward or req.matcher is None or limit <= 0:
            return []
        t0 = time.perf_counter()
        accepted = []
        text = req.matcher.forced_string()
        if text:
            for token in self._forced(text)[:limit]:
                if not req.matcher.accept_token(token):
                    break   # not expected (the tokens spell forced text); the model goes on from here
                accepted.append(token)
        tm = self.timings
        tm.forced_s += time.perf_counter() - t0
        if accepted:
            tm.forced_runs += 1
            tm.forced_tokens += len(accepted)
        return accepted

    def shutdown(self) -> None:
        if self.compiler is not None:
            self.compiler.shutdown(wait=False)
