"""The outlines-core backend: a regex (JSON schemas go through its schema-to-regex) compiled into an
Index of token transitions over our vocabulary. No EBNF and no structural tags: those are refused."""
from __future__ import annotations

import json
from typing import Optional

import outlines_core
import torch

from radixserve.grammar.backend import GrammarBackend, GrammarMatcher, fill_stop_only
from radixserve.grammar.json_schema import normalise_json_schema
from radixserve.grammar.number_bounds import bound_outlines_regex
from radixserve.grammar.regex_check import check_regex, escape_literal, strip_anchors
from radixserve.grammar.schema_support import OUTLINES_SUPPORT
from radixserve.grammar.spec import GrammarError, GrammarSpec
from radixserve.grammar.vocab import VocabInfo

# its whitespace between JSON tokens: none (as OpenAI's output), or any amount when asked for
COMPACT_WHITESPACE = ""
FREE_WHITESPACE = r"[ \t\n\r]*"


class OutlinesCoreBackend(GrammarBackend):
    name = "outlines-core"
    supported_kinds = frozenset({"json_schema", "json_object", "regex", "choice"})

    def __init__(self, vocab: VocabInfo, any_whitespace: bool = False):
        super().__init__(vocab)
        self.any_whitespace = any_whitespace
        # The Index knows one eos id, which must stay out of its token map; the matcher widens
        # "eos allowed" to every stop id itself.
        self._index_eos = vocab.stop_token_ids[0]
        by_bytes: dict[bytes, list[int]] = {}
        for token_id, text in enumerate(vocab.token_bytes):
            if text is not None:
                by_bytes.setdefault(text, []).append(token_id)
        self._vocabulary = outlines_core.Vocabulary(self._index_eos, by_bytes)

    def _compile(self, spec: GrammarSpec) -> outlines_core.Index:
        kind, payload = spec.kind, spec.payload
        if kind == "json_schema":
            normalised = normalise_json_schema(payload, OUTLINES_SUPPORT).schema
            regex = self._schema_regex(json.dumps(normalised), kind)
        elif kind == "json_object":
            regex = self._schema_regex('{"type": "object"}', kind)
        elif kind == "regex":
            check_regex(payload)
            regex = strip_anchors(payload)
        else:  # choice
            regex = "|".join(escape_literal(o) for o in payload)
        try:
            return outlines_core.Index(regex, self._vocabulary)
        except Exception as e:  # ValueError from the Rust side (bad syntax, unreachable end, ...)
            raise GrammarError(f"{kind}: {str(e).strip().splitlines()[0]}") from None

    def _schema_regex(self, schema_text: str, kind: str) -> str:
        whitespace = FREE_WHITESPACE if self.any_whitespace else COMPACT_WHITESPACE
        try:
            regex = outlines_core.json_schema.build_regex_from_schema(schema_text, whitespace_pattern=whitespace)
        except Exception as e:
            raise GrammarError(f"{kind}: {str(e).strip().splitlines()[0]}") from None
        return bound_outlines_regex(regex)

    def matcher(self, compiled: outlines_core.Index) -> "OutlinesCoreMatcher":
        return OutlinesCoreMatcher(compiled, self.vocab)


class OutlinesCoreMatcher(GrammarMatcher):
    def __init__(self, index: outlines_core.Index, vocab: VocabInfo):
        self._index = index
        self._guide = outlines_core.Guide(index)
        self._stops = vocab.stop_token_ids
        self._stop_set = frozenset(vocab.stop_token_ids)
        self._vocab_size = vocab.model_vocab_size
        self._width = vocab.bitmask_width
        self._terminated = False

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        if self._terminated:
            fill_stop_only(bitmask, row, self._stops)
            return
        # raw pointer write below: refuse anything but a contiguous int32 CPU row that exists
        if (bitmask.dtype != torch.int32 or bitmask.device.type != "cpu" or not bitmask.is_contiguous()
                or not 0 <= row < bitmask.shape[0] or bitmask.shape[1] != self._width):
            raise ValueError(f"bitmask must be a contiguous int32 CPU tensor [rows, {self._width}]")
        width = self._width
        # the guide zeroes the row and sets the bits of its allowed tokens
        self._guide.write_mask_into(bitmask.data_ptr() + row * width * 4, width, 4)
        words = bitmask[row].numpy().view("uint32")
        can_end = self._guide.is_finished()
        for token in self._stops:
            if can_end:
                words[token >> 5] |= 1 << (token & 31)
            else:  # the index's eos bit, set only in final states anyway
                words[token >> 5] &= ~(1 << (token & 31)) & 0xFFFFFFFF

    def accept_token(self, token_id: int) -> bool:
        if self._terminated or not 0 <= token_id < self._vocab_size:
            return False
        if token_id in self._stop_set:
            if self._guide.is_finished():
                self._terminated = True
                return True
            return False
        next_state: Optional[int] = self._index.get_next_state(self._guide.get_state(), token_id)
        if next_state is None:
            return False
        self._guide.advance(token_id, return_tokens=False)
        return True

    def is_terminated(self) -> bool:
        return self._terminated

    def reset(self) -> None:
        self._guide.reset()
        self._terminated = False
