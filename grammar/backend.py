"""The one interface every structured-output backend implements.

Bitmask convention (xgrammar's): an int32 CPU tensor [rows, ceil(model_vocab / 32)]; bit j of word
w set means token w * 32 + j is allowed. Stop tokens are allowed only where the grammar may end;
padding ids (beyond the tokenizer) and control tokens are never allowed.
"""
from __future__ import annotations

import abc
from typing import Any, Sequence

import numpy as np
import torch

from radixserve.grammar.spec import GrammarError, GrammarSpec
from radixserve.grammar.vocab import VocabInfo


class GrammarMatcher(abc.ABC):
    """One request's position in its grammar. Used from the engine thread only."""

    @abc.abstractmethod
    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the tokens allowed next into `bitmask[row]` (the whole row is overwritten)."""

    @abc.abstractmethod
    def accept_token(self, token_id: int) -> bool:
        """Advance by one token; False (state unchanged) if the grammar rejects it. Accepting a
        stop token where the grammar may end terminates the matcher."""

    @abc.abstractmethod
    def is_terminated(self) -> bool:
        """True once a stop token has been accepted: nothing more may follow."""

    @abc.abstractmethod
    def reset(self) -> None:
        """Back to the start of the grammar."""

    def forced_string(self) -> str:
        """The text the grammar admits as the only continuation from here (whole characters; "" when
        the next token is a choice). A backend that cannot tell says "": it never jumps forward."""
        return ""


class GrammarBackend(abc.ABC):
    """Compiles specs against one vocabulary and makes matchers for compiled grammars.
    `compile` may run on any thread (the compiler's pool); the rest runs on the engine thread."""

    name: str
    supported_kinds: frozenset[str]

    def __init__(self, vocab: VocabInfo):
        self.vocab = vocab

    def compile(self, spec: GrammarSpec) -> Any:
        """Validate and compile `spec`; raises GrammarError naming the problem. The result is
        opaque: hand it to `matcher`."""
        self.check_supported(spec)
        return self._compile(spec)

    def check_supported(self, spec: GrammarSpec) -> None:
        """GrammarError unless this backend handles the spec's kind (cheap: no compiling)."""
        if spec.kind not in self.supported_kinds:
            raise GrammarError(f"{spec.kind}: not supported by the {self.name} grammar backend "
                               f"(it supports: {', '.join(sorted(self.supported_kinds))})")

    @abc.abstractmethod
    def _compile(self, spec: GrammarSpec) -> Any:
        ...

    @abc.abstractmethod
    def matcher(self, compiled: Any) -> GrammarMatcher:
        """A fresh matcher at the start of a compiled grammar (cheap; one per request)."""

    def fill_bitmask(self, matchers: Sequence[GrammarMatcher], bitmask: torch.Tensor,
                     rows: Sequence[int]) -> None:
        """Fill `bitmask[rows[i]]` from `matchers[i]` for every i (one call per step)."""
        check_bitmask(bitmask, self.vocab)
        for matcher, row in zip(matchers, rows, strict=True):
            matcher.fill_bitmask(bitmask, row)

    def allocate_bitmask(self, rows: int, pin_memory: bool = False) -> torch.Tensor:
        """A zeroed bitmask of `rows` rows for this vocabulary; `pin_memory` where the engine's
        device copies it over asynchronously (the caller's platform decides)."""
        shape = (rows, self.vocab.bitmask_width)
        if pin_memory:
            return torch.zeros(shape, dtype=torch.int32, pin_memory=True)
        # Zeroed by numpy, not by a torch kernel: this runs on a request's thread, and a parallel
        # torch kernel there would give the process a second OpenMP thread team. libgomp then sees
        # more threads than cores and stops spin-waiting in every team, the engine's included,
        # which doubled the CPU decode step for the rest of the process's life.
        return torch.from_numpy(np.zeros(shape, dtype=np.int32))


def check_bitmask(bitmask: torch.Tensor, vocab: VocabInfo) -> None:
    if (bitmask.dtype != torch.int32 or bitmask.device.type != "cpu" or bitmask.dim() != 2
            or bitmask.shape[1] != vocab.bitmask_width or not bitmask.is_contiguous()):
        raise ValueError(f"bitmask must be a contiguous int32 CPU tensor [rows, {vocab.bitmask_width}], "
                         f"got {bitmask.dtype} {tuple(bitmask.shape)} on {bitmask.device}")


def fill_stop_only(bitmask: torch.Tensor, row: int, stop_token_ids: Sequence[int]) -> None:
    """A row that allows only the stop tokens (all a finished grammar can still emit)."""
    words = bitmask[row].numpy().view("uint32")
    words[:] = 0
    for token in stop_token_ids:
        words[token >> 5] |= 1 << (token & 31)
