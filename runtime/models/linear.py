"""The forms of one linear layer, y = x W^T + b: plain torch on every device, and on the CPU a form
that picks per call the fastest weights for the batch size (the platform builds them,
runtime/platform.py). Quantized forms read the GGUF file's own blocks (runtime/models/loader.py)."""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F


class Linear:
    """y = x W^T + b in plain torch: every device."""

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor] = None):
        self.weight, self.bias = weight, bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


# At up to this many tokens a step is bound by reading weights, and the 4-bit form reads 4x fewer
# bytes (measured on an AVX512-BF16 EPYC: 3.5 ms vs 16.6 ms for all SmolLM2 layers at one token);
# above it, bf16 wins.
QUANTIZED_MAX_TOKENS = 8
# A float32 model's block kernels beat float32 F.linear further: all SmolLM2 layers and the LM head
# at 8 / 32 / 48 tokens took 28 / 93 / 147 ms vs 84 / 144 / 164 ms on an AVX2-only EPYC
BLOCKS_FLOAT32_MAX_TOKENS = 48


class CpuLinear(Linear):
    """Chooses per call the weight form that is fastest for the batch size: small batches run on
    a quantized form where there is one, either torch's int4 kernel (bf16 activations) or the
    block kernels of kernels/cpu_kernels.cpp (float32 ones)."""

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, int4=None, blocks=None,
                 kernels=None, onednn: bool = False):
        super().__init__(weight, bias)
        self.int4 = int4  # (packed weight, group size, scales and zeros) or None
        self.blocks, self.kernels = blocks, kernels  # a cpu_kernels.BlockWeight or None
        self.matrix = None if blocks is None else blocks.matrix(None if bias is None else bias.float().contiguous())
        # oneDNN's blocked bf16 weight layout, packed once, is ~1.4x faster than F.linear at 16-256
        # tokens (measured on this model's shapes) and gives identical results
        self.onednn = torch.ops.mkldnn._reorder_linear_weight(weight, None) if onednn else None
        # picked once: a decode step makes ~120 of these calls
        self.small = self._blocks if blocks is not None else self._int4 if int4 is not None else None
        self.small_max = (BLOCKS_FLOAT32_MAX_TOKENS if blocks is not None and weight.dtype == torch.float32
                          else QUANTIZED_MAX_TOKENS)

    @property
    def quantized(self) -> bool:
        return self.small is not None

    def _blocks(self, x: torch.Tensor) -> torch.Tensor:
        # the bias is added in the kernel, in float32
        if x.dtype != torch.float32 or not x.is_contiguous():
            return self.kernels.block_linear(x.float().contiguous(), self.matrix).to(x.dtype)
        return self.kernels.block_linear(x, self.matrix)

    def _int4(self, x: torch.Tensor) -> torch.Tensor:
        packed, group, scales_zeros = self.int4
        y = torch._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), packed, group, scales_zeros).to(x.dtype)
        return y if self.bias is None else y + self.bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.small is not None and x.shape[0] <= self.small_max:
            return self.small(x)
        if self.onednn is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.onednn, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


def pack_int4(parts: Sequence) -> tuple:
    """Concatenate Int4Weights along the output dim and pack them for the CPU int4 matmul."""
    q = torch.from_numpy(np.concatenate([p.q for p in parts])).to(torch.int32)
    scale = torch.from_numpy(np.concatenate([p.scale for p in parts]))
    zero = torch.from_numpy(np.concatenate([p.zero for p in parts]))
    scales_zeros = torch.stack([scale.t(), zero.t()], dim=-1).contiguous().to(torch.bfloat16)
    return torch._convert_weight_to_int4pack_for_cpu(q, 1), parts[0].group, scales_zeros
