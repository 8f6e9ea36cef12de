"""The default backend: xgrammar (pushdown automaton over the vocabulary; every kind of spec)."""
from __future__ import annotations

import json
import re
from typing import Any, Sequence

import torch
import xgrammar as xgr

from radixserve.grammar.backend import GrammarBackend, GrammarMatcher, check_bitmask, fill_stop_only
from radixserve.grammar.json_schema import normalise_json_schema
from radixserve.grammar.number_bounds import bound_xgrammar_ebnf
from radixserve.grammar.regex_check import check_regex, dot_excludes_newline, escape_literal
from radixserve.grammar.schema_support import XGRAMMAR_SUPPORT
from radixserve.grammar.spec import GRAMMAR_KINDS, GrammarError, GrammarSpec, StructuralTagSpec
from radixserve.grammar.vocab import VocabInfo

# Without free whitespace, JSON comes out as OpenAI's does: no whitespace between tokens at all,
# so a model cannot loop on it.
COMPACT_SEPARATORS = (",", ":")

# xgrammar's C++ errors start with "[12:34:56] /path/file.cc:123: "
_CPP_PREFIX = re.compile(r"^\[[\d:]+\]\s+\S+:\d+:\s*")
# xgrammar prints U+0080..U+00FF as `\xHH`, and its parser reads every hex digit after `\x`: "é0"
# printed comes back as U+E90, a character no token spells (an empty mask). `\u00HH` reads 4 digits.
_BYTE_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\x([0-9a-fA-F]{2})")


def _exact_escapes(ebnf: str) -> str:
    return _BYTE_ESCAPE.sub(lambda m: f"{m.group(1)}\\u00{m.group(2)}", ebnf)


def _error(kind: str, e: Exception) -> GrammarError:
    lines = [line for line in str(e).strip().splitlines() if line.strip()] or [type(e).__name__]
    return GrammarError(f"{kind}: {_CPP_PREFIX.sub('', lines[0]).strip()}")


class XGrammarBackend(GrammarBackend):
    name = "xgrammar"
    supported_kinds = GRAMMAR_KINDS

    def __init__(self, vocab: VocabInfo, compile_threads: int = 2, fill_threads: int = 1,
                 any_whitespace: bool = False):
        super().__init__(vocab)
        self.any_whitespace = any_whitespace
        # Token bytes decoded by us (RAW): one decoding for both backends; b"" marks an id that is
        # never text, which xgrammar then treats as a special token and never allows.
        encoded = [b if b is not None else b"" for b in vocab.token_bytes]
        self._info = xgr.TokenizerInfo(encoded, xgr.VocabType.RAW, vocab_size=vocab.model_vocab_size,
                                       stop_token_ids=list(vocab.stop_token_ids))
        # our GrammarCompiler caches (and remembers failures); xgrammar's cache would only duplicate it
        self._compiler = xgr.GrammarCompiler(self._info, max_threads=compile_threads, cache_enabled=False)
        # one fill thread by default: on 2 cores, 32 rows filled in 0.40 ms vs 0.59 ms with two
        # (bench/structured.py), since the second thread competes with torch's own
        self._batch = xgr.BatchGrammarMatcher(fill_threads)
        self._never = vocab.non_text_token_ids

    def _compile(self, spec: GrammarSpec) -> xgr.CompiledGrammar:
        kind, payload = spec.kind, spec.payload
        if kind == "regex":
            check_regex(payload)
        try:
            if kind == "json_schema":
                return self._compiler.compile_grammar(self.schema_ebnf(payload))
            if kind == "json_object":
                return self._compiler.compile_grammar(self.schema_ebnf({"type": "object"}, strict=False))
            if kind == "regex":
                return self._compiler.compile_regex(dot_excludes_newline(payload))
            if kind == "choice":
                return self._compiler.compile_regex("|".join(escape_literal(o) for o in payload))
            if kind == "ebnf":
                return self._compiler.compile_grammar(payload, root_rule_name="root")
            return self._compiler.compile_structural_tag(json.dumps(self._structural_tag_format(payload)))
        except GrammarError:
            raise
        except Exception as e:  # xgrammar raises RuntimeError / ValueError / its own types
            raise _error(kind, e) from None

    def schema_ebnf(self, schema, strict: bool = True, where: str = "json_schema") -> str:
        """The EBNF xgrammar builds for the normalised `schema`, its numbers digit-bounded."""
        normalised = normalise_json_schema(schema, XGRAMMAR_SUPPORT, where).schema
        try:
            # json.dumps keeps the user's property order, which is the order of generation
            grammar = xgr.Grammar.from_json_schema(
                json.dumps(normalised), any_whitespace=self.any_whitespace, strict_mode=strict,
                separators=None if self.any_whitespace else COMPACT_SEPARATORS)
        except Exception as e:
            raise _error(where, e) from None
        return bound_xgrammar_ebnf(_exact_escapes(str(grammar)))

    def _structural_tag_format(self, spec: StructuralTagSpec) -> dict[str, Any]:
        tags = [{"type": "tag", "begin": t.begin, "end": t.end, "content": {
            "type": "grammar", "grammar": self.schema_ebnf(t.schema, where=f"structural_tag: tags[{i}].schema")}}
            for i, t in enumerate(spec.tags)]
        return {"type": "structural_tag", "format": {
            "type": "triggered_tags", "triggers": list(spec.triggers), "tags": tags,
            "at_least_one": spec.at_least_one, "stop_after_first": spec.stop_after_first}}

    def matcher(self, compiled: xgr.CompiledGrammar) -> "XGrammarMatcher":
        return XGrammarMatcher(xgr.GrammarMatcher(compiled), self.vocab, self._never)

    def fill_bitmask(self, matchers: Sequence[GrammarMatcher], bitmask: torch.Tensor,
                     rows: Sequence[int]) -> None:
        """All live rows in one threaded xgrammar call."""
        check_bitmask(bitmask, self.vocab)
        live, live_rows = [], []
        for matcher, row in zip(matchers, rows, strict=True):
            if matcher.is_terminated():
                fill_stop_only(bitmask, row, self.vocab.stop_token_ids)
            else:
                live.append(matcher._matcher)
                live_rows.append(int(row))
        if live:
            self._batch.batch_fill_next_token_bitmask(live, bitmask, live_rows)


class XGrammarMatcher(GrammarMatcher):
    def __init__(self, matcher: xgr.GrammarMatcher, vocab: VocabInfo, never: frozenset[int]):
        self._matcher = matcher
        self._vocab = vocab
        self._never = never

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        if self._matcher.is_terminated():
            fill_stop_only(bitmask, row, self._vocab.stop_token_ids)
        else:
            self._matcher.fill_next_token_bitmask(bitmask, row)

    def accept_token(self, token_id: int) -> bool:
        # Checked here first: xgrammar logs a warning for every special or out-of-range id it refuses.
        if not 0 <= token_id < self._vocab.model_vocab_size or token_id in self._never:
            return False
        return self._matcher.accept_token(token_id)

    def is_terminated(self) -> bool:
        return self._matcher.is_terminated()

    def forced_string(self) -> str:
        if self._matcher.is_terminated():
            return ""
        return self._matcher.find_jump_forward_string()

    def reset(self) -> None:
        self._matcher.reset()
