"""Chained hashes of page-aligned token prefixes: the name a replica and a router share for "the
first k pages of this prompt". Hash i covers tokens [0, (i + 1) * page_size), so two prompts share
hash i exactly when they share their first i + 1 pages (up to 64-bit collisions). Stable across
processes and machines (blake2b, not Python's salted `hash`)."""
from __future__ import annotations

import hashlib
from typing import Optional, Sequence

import numpy as np

ROOT_HASH = 0  # the empty prefix


def root_hash(salt: Optional[str]) -> int:
    """The hash before a prompt's first page: ROOT_HASH for the shared tree, else one per cache
    salt, so that no page hash of one tenant's prompts equals another's."""
    if salt is None:
        return ROOT_HASH
    digest = hashlib.blake2b(salt.encode(), digest_size=8, person=b"cache_salt").digest()
    return int.from_bytes(digest, "little") or 1


def page_hashes(tokens: Sequence[int], page_size: int, parent: int = ROOT_HASH) -> list[int]:
    """One hash per whole page of `tokens`, each chained on the one before (`parent` for the first:
    the hash of whatever prefix precedes `tokens`); an unaligned tail gets none."""
    n = len(tokens) // page_size
    if n == 0:
        return []
    data = np.asarray(tokens[: n * page_size], dtype=np.int64).tobytes()
    step = page_size * 8
    out, h = [], parent
    for i in range(n):
        digest = hashlib.blake2b(data[i * step:(i + 1) * step], digest_size=8,
                                 key=h.to_bytes(8, "little")).digest()
        h = int.from_bytes(digest, "little")
        out.append(h)
    return out
