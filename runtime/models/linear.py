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
    dim) through the block kernels: a decode step reads 0.56-1.06 bytes a weight instead of
    float32's 4, and no float copy of the weights exists. Activations are float32 (the kernels
    round them to int8 per block of 32).

    A prefill chunk goes another way where the platform has one: `gemms`, (name, from how many
    rows) in the platform's order of preference, the first this matrix can take:
    - "int8" (a CPU with VNNI and no AMX): the kernels' own GEMM on int8 panels of the weight,
      repacked while every row passes (kernels/cpu_kernels.cpp's block_gemm), where the matrix's
      width is a multiple of 256;
    - "bf16" (AMX, or AVX512-BF16 for the widths the int8 GEMM does not take): panels dequantised
      to bf16 a few MB at a time and multiplied by oneDNN's bf16 GEMM: 2.5x the block kernels at
      64 rows, 3-6x at 512 on a 2-core AMX Xeon (bench/gemm.py).
    Either rounds differently from the block kernels; decode steps, a few rows each, stay on them."""
    quantized = True

    def __init__(self, parts: Sequence, bias: Optional[torch.Tensor], kernels,
                 gemms: Sequence[tuple[str, int]] = ()):
        from radixserve.kernels.cpu_kernels import block_matrix
        super().__init__(None, None if bias is None else bias.float().contiguous())
        self.parts, self.kernels = list(parts), kernels
        self.matrix = block_matrix(self.parts, self.bias)   # the fused decode layers read it too
        self.choose(gemms)

    def choose(self, gemms: Sequence[tuple[str, int]]) -> None:
        """The first of `gemms` this matrix can take (none: the block kernels at every size)."""
        usable = [(name, rows) for name, rows in gemms
                  if name != "int8" or (self.kernels.int8_gemm and self.matrix.cols % 256 == 0)]
        self.prefill_gemm, self.gemm_rows = usable[0] if usable else (None, None)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.prefill_gemm is not None and x.shape[0] >= self.gemm_rows:
            if self.prefill_gemm == "int8":
                return self.kernels.block_gemm(x.float().contiguous(), self.matrix).to(x.dtype)
            return self._bf16_panels(x).to(x.dtype)
        if x.dtype != torch.float32 or not x.is_contiguous():
            return self.kernels.block_linear(x.float().contiguous(), self.matrix).to(x.dtype)
        return self.kernels.block_linear(x, self.matrix)

    def _bf16_panels(self, x: torch.Tensor) -> torch.Tensor:
        m = self.matrix
        xb, out = x.to(torch.bfloat16), torch.empty(x.shape[0], m.rows)
        step = max(16, BF16_PANEL_BYTES // (2 * m.cols))
        for r0 in range(0, m.rows, step):
            r1 = min(m.rows, r0 + step)
            out[:, r0:r1] = torch.mm(xb, self.kernels.dequantize_panel_bf16(m, r0, r1).t())
        if self.bias is not None:
            out += self.bias
        return out


# Rows from which a prefill's linear layers take the platform's GEMM, and the weight panel the bf16
# one dequantises at a time (bench/gemm.py measures them). With AMX the bf16 GEMM pays from 64 rows,
# with AVX512-BF16 alone from ~128 (panels / blocks at 64 / 128 / 192 rows on a Zen 4 EPYC: Q4_K
# 0.83 / 1.06 / 1.17x, Q8_0 1.15 / 1.39 / 1.75x).
# On a 2-core Zen 4 EPYC (VNNI, AVX512-BF16, no AMX), the int8 GEMM over the block kernels at 32 /
# 48 / 64 rows: Q4_K 0.73 / 0.96 / 1.21x, Q6_K 0.94 / 1.18 / 1.42x, Q8_0 0.97 / 2.25 / 1.99x; over
# the bf16 panels 1.2-1.6x from 64 rows to 512
BF16_GEMM_ROWS = 64
BF16_GEMM_ROWS_NO_AMX = 128
INT8_GEMM_ROWS = 64
BF16_PANEL_BYTES = 2 << 20


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
        from radixserve.kernels.cpu_kernels import block_segment
        self.table, self.kernels = table, kernels
        self.segment = block_segment(table)   # built once: a decode step looks rows up every time

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        return self.kernels.dequantize_rows(self.table, ids.to(torch.int64).contiguous(), self.segment)
