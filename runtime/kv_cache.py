"""The KV cache tensors: one preallocated [layers, slots, kv_heads, head_dim] buffer each for K and V."""
from __future__ import annotations

import torch

from radixserve.runtime.config import EngineConfig
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


def kv_cache_tokens(config: EngineConfig, mc: ModelConfig, dtype: torch.dtype, free_bytes: int) -> int:
    """Token slots in the KV pool: `--kv-cache-tokens`, else `--mem-fraction` of `free_bytes`."""
    if config.kv_cache_tokens is not None:
        tokens = config.kv_cache_tokens
    else:
        per_token = KVCache.bytes_per_token(mc.num_layers, mc.num_kv_heads, mc.head_dim, dtype)
        tokens = int(free_bytes * config.mem_fraction) // per_token
        # more than every running request at full context can never be used at once
        tokens = min(tokens, config.max_running_requests * mc.max_context_len)
    tokens -= tokens % config.page_size
    if tokens < config.page_size:
        raise ValueError("not enough memory for a single KV page")
    return tokens
