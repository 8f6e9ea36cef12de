"""The KV cache tensors: one preallocated [layers, slots, kv_heads, head_dim] buffer each for K and V."""
from __future__ import annotations

import torch


class KVCache:
    """K and V as [layers, pages + 1, page_size, kv_heads, head_dim]; the extra page is the
    zeroed padding page that masked reads point at.
    """

    def __init__(self, num_layers: int, num_pages: int, page_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device):
        shape = (num_layers, num_pages + 1, page_size, num_kv_heads, head_dim)
        nbytes = 2 * torch.Size(shape).numel() * torch.tensor([], dtype=dtype).element_size()
        # Slots past a request's length inside its pages are read under a mask, so they must hold
        # finite values. A large CPU buffer comes straight from mmap, already zeroed by the OS;
        # zero-filling gigabytes up front would cost seconds. Small or device buffers are zeroed.
        alloc = torch.empty if (device.type == "cpu" and nbytes > (256 << 20)) else torch.zeros
        self.k = alloc(shape, dtype=dtype, device=device)
        self.v = alloc(shape, dtype=dtype, device=device)
        self.pad_page = num_pages
        self.k[:, num_pages].zero_()
        self.v[:, num_pages].zero_()

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * torch.tensor([], dtype=dtype).element_size()
