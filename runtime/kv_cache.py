"""The KV cache tensors: one preallocated [layers, slots, kv_heads, head_dim] buffer each for K and V
(two pairs for a model with sliding-window layers: theirs live in a smaller pool)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from radixserve.runtime.config import MAX_DECODE_ROWS, EngineConfig
from radixserve.runtime.models.config import ModelConfig
from radixserve.runtime.platform import get_platform


class KVCache:
    """K and V as [layers, pages + 1, page_size, kv_heads, head_dim]; the extra page is the
    zeroed padding page that masked reads point at.
    """

    def __init__(self, num_layers: int, num_pages: int, page_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device):
        shape = (num_layers, num_pages + 1, page_size, num_kv_heads, head_dim)
        # Zeroed: slots past a request's length are read under a mask and must be finite. The
        # platform decides how (on the CPU: by the OS, on first write)
        self.k, self.v = get_platform(device).zeroed_pair(shape, dtype)
        self.pad_page = num_pages

    def clear_pad_page(self) -> None:
        """Zero the padding page again after dummy tokens (warm-up, graph capture) wrote to it."""
        self.k[:, self.pad_page].zero_()
        self.v[:, self.pad_page].zero_()

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * torch.tensor([], dtype=dtype).element_size()


@dataclass
class KVLayers:
    """Where each layer's K/V live: `full` holds the global layers' (every position of every KV
    page); a model with sliding-window layers keeps theirs in `windowed`, a smaller pool of window
    pages (radix/window_pages.py). Without windowed layers `full` holds every layer."""
    full: KVCache
    windowed: Optional[KVCache] = None
    groups: tuple[tuple[bool, int], ...] = ()   # per model layer: (windowed, its index in that cache)

    @classmethod
    def of(cls, mc: ModelConfig, num_pages: int, num_window_pages: Optional[int], page_size: int,
           dtype: torch.dtype, device: torch.device) -> "KVLayers":
        def cache(layers: int, pages: int) -> KVCache:
            return KVCache(layers, pages, page_size, mc.num_kv_heads, mc.head_dim, dtype, device)
        if num_window_pages is None:
            return cls(cache(mc.num_layers, num_pages), None, tuple((False, i) for i in range(mc.num_layers)))
        windowed = [mc.window(i) is not None for i in range(mc.num_layers)]
        groups = tuple((w, sum(1 for x in windowed[:i] if x == w)) for i, w in enumerate(windowed))
        return cls(cache(windowed.count(False), num_pages), cache(windowed.count(True), num_window_pages), groups)

    def clear_pad_page(self) -> None:
        for cache in (self.full, self.windowed):
            if cache is not None:
                cache.clear_pad_page()


def kv_cache_tokens(config: EngineConfig, mc: ModelConfig, dtype: torch.dtype, free_bytes: int) -> int:
    """Token slots in the KV pool: `--kv-cache-tokens`, else `--mem-fraction` of `free_bytes`
    (with sliding-window layers, whose window pool is `swa_full_tokens_ratio` of it, those count
    for that share of a token, and the window pool's floor is paid first where it is larger; with
    `disable_hybrid_swa_memory` in full)."""
    if config.kv_cache_tokens is not None:
        tokens = config.kv_cache_tokens
    else:
        windowed = 0 if config.disable_hybrid_swa_memory else mc.num_windowed_layers
        full = KVCache.bytes_per_token(mc.num_layers - windowed, mc.num_kv_heads, mc.head_dim, dtype)
        window = KVCache.bytes_per_token(windowed, mc.num_kv_heads, mc.head_dim, dtype)
        budget, floor = free_bytes * config.mem_fraction, _window_floor(config, mc) if windowed else 0
        tokens = int(budget // (full + config.swa_full_tokens_ratio * window))
        if config.swa_full_tokens_ratio * tokens < floor and full:   # the window pool's floor is paid first
            tokens = int(max(0.0, budget - floor * window) // full)
        # more than every running request at full context can never be used at once
        tokens = min(tokens, config.max_running_requests * mc.max_context_len)
    tokens -= tokens % config.page_size
    if tokens < config.page_size:
        raise ValueError("not enough memory for a single KV page")
    return tokens


def window_tokens(config: EngineConfig, mc: ModelConfig, tokens: int) -> Optional[int]:
    """Slots of the sliding-window layers' own pool beside a KV pool of `tokens`; None without such
    layers. `swa_full_tokens_ratio` of the pool, and never less than one request needs at once:
    its window and a chunk of new tokens, each rounded out to pages (`_window_floor`)."""
    if mc.sliding_window is None or config.disable_hybrid_swa_memory:
        return None
    p = config.page_size
    n = max(math.ceil(config.swa_full_tokens_ratio * tokens), _window_floor(config, mc))
    return min(tokens, -(-n // p) * p)


def _window_floor(config: EngineConfig, mc: ModelConfig) -> int:
    """What one request needs of the window pool at once: its window, and a chunk of prompt or a run
    of forced tokens (jump-forward's decode rows), each rounded out to pages."""
    new = max(min(config.chunked_prefill_size, config.max_batched_tokens), MAX_DECODE_ROWS)
    return mc.sliding_window + new + 2 * config.page_size
