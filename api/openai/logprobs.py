"""Engine logprobs in OpenAI's two shapes: chat (`content: [{token, logprob, bytes, top_logprobs}]`)
and legacy completions (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`)."""
from __future__ import annotations

import functools
from typing import Any, Optional

from radixserve.runtime.request import TokenLogprob
from radixserve.runtime.tokenizer import Tokenizer


@functools.lru_cache(maxsize=1)
def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet, char -> byte (the inverse of its bytes_to_unicode)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


class TokenTexts:
    """Each token's exact bytes and display string, computed once per token id."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def get(self, token_id: int) -> tuple[str, list[int]]:
        hit = self._cache.get(token_id)
        if hit is None:
            piece = self.tokenizer.token_text(token_id) or ""
            table = _byte_level_decoder()
            if token_id not in self.tokenizer.special_ids and piece and all(ch in table for ch in piece):
                raw = bytes(table[ch] for ch in piece)
            else:  # a special or added token: its text is what it stands for
                raw = piece.encode("utf-8")
            hit = (raw.decode("utf-8", errors="replace"), list(raw))
            self._cache[token_id] = hit
        return hit


def chat_logprobs(items: list[TokenLogprob], texts: TokenTexts, top_k: int) -> dict[str, Any]:
    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        token, raw = texts.get(token_id)
        return {"token": token, "logprob": _finite(logprob), "bytes": raw}

    content = []
    for lp in items:
        e = entry(lp.token_id, lp.logprob)
        e["top_logprobs"] = [entry(t, v) for t, v in lp.top[:top_k]]
        content.append(e)
    return {"content": content, "refusal": None}


def completion_logprobs(items: list[TokenLogprob], texts: TokenTexts, top_k: int,
                        offset: int = 0) -> dict[str, Any]:
    tokens, token_logprobs, tops, offsets = [], [], [], []
    for lp in items:
        token, _ = texts.get(lp.token_id)
        tokens.append(token)
        token_logprobs.append(_finite(lp.logprob))
        tops.append({texts.get(t)[0]: _finite(v) for t, v in lp.top[:top_k]} if top_k else None)
        offsets.append(offset)
        offset += len(token)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": offsets}


def _finite(value: float) -> Optional[float]:
    # JSON has no -inf; OpenAI reports impossible tokens at -9999.0.
    return max(float(value), -9999.0)
