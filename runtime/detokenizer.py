"""Incremental detokenization with stop strings.

Text is released only when it is final: a trailing incomplete UTF-8 sequence
waits for its next token, and a suffix that could begin a stop string waits
until it either completes the stop string (then it and everything after are
dropped) or stops matching.
"""
from __future__ import annotations

from radixserve.runtime.tokenizer import Tokenizer

_CONTEXT_TOKENS = 6  # prompt tokens kept as left context, so the first word keeps its leading space


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, prompt_ids: list[int], stop: list[str], skip_special_tokens: bool):
        self.tokenizer = tokenizer
        self.skip_special = skip_special_tokens
        self.stop = stop
        self.max_stop = max((len(s) for s in stop), default=0)
        self.ids = list(prompt_ids[-_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.text = ""          # decoded output so far (cut at a stop string once found)
        self.sent = 0           # characters of `text` already released
        self.stopped = False    # a stop string was found

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special)

    def add_token(self, token_id: int) -> None:
        """Decode one more token; sets `stopped` when a stop string completes."""
        self.ids.append(token_id)
        prefix = self._decode(self.ids[self.prefix_offset:self.read_offset])
        full = self._decode(self.ids[self.prefix_offset:])
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return  # nothing final yet (an incomplete UTF-8 sequence, or a skipped special token)
        start = len(self.text)
        self.text += full[len(prefix):]
        # keep the window short: the next decode only needs tokens from read_offset on
        cut = self.read_offset
        self.ids = self.ids[cut:]
        self.prefix_offset, self.read_offset = 0, len(self.ids)
        if self.stop:
            self._find_stop(max(0, start - self.max_stop + 1))

    def _find_stop(self, search_from: int) -> None:
        hits = [i for i in (self.text.find(s, search_from) for s in self.stop) if i >= 0]
        if hits:
            self.text = self.text[:min(hits)]
            self.stopped = True

    def _held_back(self) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
        for n in range(min(self.max_stop - 1, len(self.text) - self.sent), 0, -1):
            tail = self.text[-n:]
            if any(s.startswith(tail) for s in self.stop):
                return n
        return 0

    def pop_delta(self, final: bool = False) -> str:
        """Text that is now safe to show; `final` releases everything held back."""
        end = len(self.text) if (final or self.stopped or not self.stop) else len(self.text) - self._held_back()
        delta = self.text[self.sent:end]
        self.sent = end
        return delta
