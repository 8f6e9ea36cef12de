"""What a grammar backend needs to know about the model's vocabulary: the token strings as the
tokenizer stores them, how to turn them into bytes, which ids stop generation, which ids are
control tokens (never grammar text), and the model's own vocab size (the logits width)."""
from __future__ import annotations

import enum
from dataclasses import dataclass
from functools import cached_property
from typing import Optional, Sequence


class VocabType(str, enum.Enum):
    BYTE_LEVEL = "byte_level"        # GPT-2 style: each byte spelled as one printable character
    BYTE_FALLBACK = "byte_fallback"  # sentencepiece: "▁" for space, "<0xNN>" for raw bytes
    RAW = "raw"                      # token strings are the text itself (tiktoken-style)


def _byte_level_alphabet() -> dict[str, int]:
    """The GPT-2 byte-to-unicode table, inverted: printable bytes spell themselves, the others are
    shifted to U+0100 and up in byte order."""
    kept = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    kept_set = set(kept)
    table = {chr(b): b for b in kept}
    shifted = 0
    for b in range(256):
        if b not in kept_set:
            table[chr(256 + shifted)] = b
            shifted += 1
    return table


_BYTE_LEVEL_CHARS = _byte_level_alphabet()
_SPIECE_SPACE = "\u2581"


def decode_token(text: str, vocab_type: VocabType) -> bytes:
    """The bytes a stored token string stands for."""
    if vocab_type is VocabType.BYTE_LEVEL:
        try:
            return bytes(_BYTE_LEVEL_CHARS[c] for c in text)
        except KeyError:
            # not spelled in the byte alphabet: an added token kept as plain text
            return text.encode("utf-8")
    if vocab_type is VocabType.BYTE_FALLBACK:
        if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
            try:
                return bytes([int(text[3:5], 16)])
            except ValueError:
                pass
        return text.replace(_SPIECE_SPACE, " ").encode("utf-8")
    return text.encode("utf-8")


def detect_vocab_type(tokens: Sequence[Optional[str]], decoder_description: str = "") -> VocabType:
    """Byte-fallback if the vocab holds the "<0xNN>" byte pieces, byte-level if the decoder says
    so or the vocab is spelled in the byte alphabet, otherwise raw."""
    present = {t for t in tokens if t is not None}
    if sum(f"<0x{b:02X}>" in present for b in range(256)) >= 128:
        return VocabType.BYTE_FALLBACK
    if "ByteLevel" in decoder_description:
        return VocabType.BYTE_LEVEL
    if sum(c in present for c in _BYTE_LEVEL_CHARS) >= 200:
        in_alphabet = sum(all(c in _BYTE_LEVEL_CHARS for c in t) for t in present)
        if in_alphabet >= 0.99 * len(present):
            return VocabType.BYTE_LEVEL
    return VocabType.RAW


@dataclass(frozen=True, eq=False)
class VocabInfo:
    """Built once by the runtime from its tokenizer (`Tokenizer.vocab_info()`).

    tokens: the tokenizer's stored string for each id, in id order (None where an id is unused).
    model_vocab_size: the logits width; ids at or beyond len(tokens) are padding and are never
        allowed in a constrained row, nor are ids of `tokens` beyond it.
    stop_token_ids: allowed exactly where the grammar may end; accepting one terminates a matcher.
    special_token_ids: control tokens (chat markers and the like): never part of grammar text.
    literal_token_ids: added tokens stored as plain text rather than in the vocab's encoding.
    """
    tokens: tuple[Optional[str], ...]
    vocab_type: VocabType
    stop_token_ids: tuple[int, ...]
    model_vocab_size: int
    special_token_ids: frozenset[int] = frozenset()
    literal_token_ids: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "tokens", tuple(self.tokens))
        object.__setattr__(self, "vocab_type", VocabType(self.vocab_type))
        object.__setattr__(self, "stop_token_ids", tuple(sorted(set(self.stop_token_ids))))
        if self.model_vocab_size <= 0:
            raise ValueError("model_vocab_size must be positive")
        if not self.stop_token_ids:
            raise ValueError("a grammar needs at least one stop token id to end on")
        bad = [i for i in self.stop_token_ids if not 0 <= i < self.model_vocab_size]
        if bad:
            raise ValueError(f"stop token ids {bad} are outside the model vocab ({self.model_vocab_size})")

    @property
    def bitmask_width(self) -> int:
        """int32 words per bitmask row: ceil(model_vocab_size / 32)."""
        return (self.model_vocab_size + 31) // 32

    @cached_property
    def token_bytes(self) -> tuple[Optional[bytes], ...]:
        """For every id below model_vocab_size: the bytes it adds to the text, or None when it can
        never be grammar text (stop, special, unused or padding ids)."""
        never = self.special_token_ids | set(self.stop_token_ids)
        out: list[Optional[bytes]] = []
        for i in range(self.model_vocab_size):
            text = self.tokens[i] if i < len(self.tokens) else None
            if text is None or i in never:
                out.append(None)
            elif i in self.literal_token_ids:
                out.append(text.encode("utf-8"))
            else:
                out.append(decode_token(text, self.vocab_type) or None)
        return tuple(out)

    @cached_property
    def non_text_token_ids(self) -> frozenset[int]:
        """Ids below model_vocab_size that are not stop ids and can never be grammar text."""
        stops = set(self.stop_token_ids)
        return frozenset(i for i, b in enumerate(self.token_bytes) if b is None and i not in stops)
