"""The forms of one linear layer, y = x W^T + b, and of the embedding lookup: plain torch on every
device, and on the CPU the block kernels over a GGUF file's own quantized blocks (the platform
picks, runtime/platform.py)."""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F


class Linear:
    """y = x W^T + b in plain torch: every device."""
    quantized = False

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor] = None):
        self.weight, self.bias = weight, bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class CpuLinear(Linear):
    """A dense weight on the CPU: oneDNN's blocked bf16 layout where the CPU takes it."""

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, onednn: bool = False):
        super().__init__(weight, bias)
        # packed once, ~1.4x faster than F.linear at 16-256 tokens on SmolLM2's shapes, same results
        self.onednn = torch.ops.mkldnn._reorder_linear_weight(weight, None) if onednn else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.onednn is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.onednn, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


class BlockLinear(Linear):
    """Block-quantized weights (runtime/models/quant.py's BlockTensors, stacked along the output
    dim) through the block kernels at every batch size: a decode step reads 0.56-1.06 bytes a
    weight instead of float32's 4, and no float copy of the weights exists. Activations are
    float32 (the kernels round them to int8 per block of 32)."""
    quantized = True

    def __init__(self, parts: Sequence, bias: Optional[torch.Tensor], kernels):
        from radixserve.kernels.cpu_kernels import block_matrix
        super().__init__(None, None if bias is None else bias.float().contiguous())
        self.parts, self.kernels = list(parts), kernels
        self.matrix = block_matrix(self.parts, self.bias)   # the fused decode layers read it too

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or not x.is_contiguous():
            return self.kernels.block_linear(x.float().contiguous(), self.matrix).to(x.dtype)
        return self.kernels.block_linear(x, self.matrix)


class Embedding:
    """Rows of a dense embedding, as float32."""

    def __init__(self, weight: torch.Tensor):
        self.weight = weight

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight).float()


class BlockEmbedding:
    """Rows of a block-quantized embedding, dequantised as they are looked up (a step reads a few
    rows of a table that may be hundreds of MB)."""

    def __init__(self, table, kernels):
        self.table, self.kernels = table, kernels

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        return self.kernels.dequantize_rows(self.table, ids.to(torch.int64).contiguous())
