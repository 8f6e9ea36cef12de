"""Jump-forward decoding: the tokens a grammar forces next, as the model's own tokenizer writes them.

A grammar often admits exactly one continuation (an object's next key, `":`, the rest of a unique
enum value, tool-call markup). Its matcher names that string; this module turns it into tokens the
engine appends without sampling, computed in one extend chunk instead of one step each.

Tokenizing the forced string on its own can split it where the model never would: the string's last
token may merge with what the model writes next (`":"` + `(` is `":` + `"(` in some vocabularies).
The rule, which `tests/test_jump_forward.py` checks on random walks with the real vocabulary:

    the forced run for string S is the longest prefix F of encode(S) that
    (1) leaves at least S's last token to the model, which then picks the merge at the boundary;
    (2) every probe continuation keeps: encode(S + c) starts with F for each c in PROBES;
    (3) spells a prefix of S's bytes (a tokenizer that adds a prefix space jumps nowhere).

So F is what the tokenizer makes of that text whatever follows it.
"""
from __future__ import annotations

import os
from collections import OrderedDict
from typing import Callable, Optional, Sequence

# One character of each class a JSON or tool-call continuation starts with: letters, digits,
# whitespace, the JSON punctuation, and multi-byte text.
PROBES = ("a", "Z", "0", " ", "\n", '"', ",", ":", "}", "]", "{", "[", "-", ".", "_", "\\", "(", "é", "中")

CACHE_SIZE = 4096   # forced strings repeat across requests of one schema (its keys); a small LRU


class ForcedTokens:
    """forced string -> the tokens to append, per the module's rule; memoised."""

    def __init__(self, encode: Callable[[str], list[int]], token_bytes: Sequence[Optional[bytes]],
                 probes: Sequence[str] = PROBES):
        self._encode = encode
        self._bytes = token_bytes
        self._probes = tuple(probes)
        self._cache: OrderedDict[str, tuple[int, ...]] = OrderedDict()

    def __call__(self, forced: str) -> tuple[int, ...]:
        hit = self._cache.get(forced)
        if hit is not None:
            self._cache.move_to_end(forced)
            return hit
        tokens = self._tokens(forced)
        self._cache[forced] = tokens
        if len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        return tokens

    def _tokens(self, forced: str) -> tuple[int, ...]:
        if not forced:
            return ()
        tokens = self._encode(forced)
        n = len(tokens) - 1
        for c in self._probes:
            if n <= 0:
                return ()
            n = min(n, len(os.path.commonprefix([tokens, self._encode(forced + c)])))
        head = tokens[:n]
        if any(t >= len(self._bytes) or not self._bytes[t] for t in head):
            return ()   # a control token, or one the grammar's vocabulary lacks
        if not forced.encode("utf-8").startswith(b"".join(self._bytes[t] for t in head)):
            return ()
        return tuple(head)

