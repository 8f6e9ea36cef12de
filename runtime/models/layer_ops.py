"""The small elementwise steps of a decoder layer, in the form the device's platform picks: plain
torch (every device), or the CPU kernels that do each in one call (kernels/cpu_kernels.py).

Both forms compute the same thing and round where the other does: the model does not know which
one runs.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
import torch.nn.functional as F

from radixserve.runtime.models.rope import apply_rope

KERNEL_DTYPES = (torch.float32, torch.bfloat16)


class TorchLayerOps:
    def add_rms_norm(self, x: torch.Tensor, delta: Optional[torch.Tensor], weight: torch.Tensor, eps: float,
                     dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The float32 residual stream plus `delta` (when given), and its RMS norm times `weight`
        in `dtype`."""
        if delta is not None:
            x = x + delta
        return x, F.rms_norm(x, (x.shape[-1],), weight, eps).to(dtype)

    def head_norms(self, qk: torch.Tensor, heads: int, q_norm: torch.Tensor, k_norm: torch.Tensor,
                   eps: float) -> torch.Tensor:
        """qk [T, heads + kv_heads, d] with each query head RMS-normed times q_norm, each key head
        times k_norm (Qwen3; a new tensor here, in place in other forms)."""
        d = qk.shape[-1]
        return torch.cat([F.rms_norm(qk[:, :heads], (d,), q_norm, eps), F.rms_norm(qk[:, heads:], (d,), k_norm, eps)],
                         dim=1)

    def rope_positions(self, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor) -> Any:
        """A step's rotary state, from the [max_len, head_dim] tables of rope.py."""
        return cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)

    def rope(self, qk: torch.Tensor, state: Any) -> torch.Tensor:
        """qk [T, heads, head_dim] rotated (a new tensor here; in place in other forms)."""
        return apply_rope(qk, *state)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up for rows [gate | up]."""
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    def gelu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """gelu(gate) * up (tanh approximation: GeGLU) for rows [gate | up]."""
        gate, up = gate_up.chunk(2, dim=-1)
        return F.gelu(gate, approximate="tanh") * up

    def fused_decode(self, layers: Sequence, cos: torch.Tensor, sin: torch.Tensor,
                     ends: Optional[tuple] = None) -> Optional[Any]:
        """The layers as one call each for pure-decode steps (runtime/models/fused_decode.py), where
        this form has one for them; `ends`: the model's embedding, final norm (weight, eps) and LM
        head, where a step may run whole."""
        return None


class CpuLayerOps(TorchLayerOps):
    """The CPU kernels, for the dtypes they are built for; anything else takes the torch form."""

    def __init__(self, kernels):
        self.k = kernels

    def add_rms_norm(self, x, delta, weight, eps, dtype):
        if dtype not in KERNEL_DTYPES or (delta is not None and delta.stride(-1) != 1):
            return super().add_rms_norm(x, delta, weight, eps, dtype)
        return x, self.k.add_rms_norm(x, delta, weight, eps, dtype)

    def head_norms(self, qk, heads, q_norm, k_norm, eps):
        # the fused decode layer's own code (kernels/cpu_kernels.cpp `head_rms_norms`)
        if qk.dtype != torch.float32 or qk.stride(2) != 1 or qk.stride(1) != qk.shape[2]:
            return super().head_norms(qk, heads, q_norm, k_norm, eps)
        self.k.head_rms_norms_(qk, heads, q_norm, k_norm, eps)
        return qk

    def rope_positions(self, cos, sin, positions):
        return cos, sin, positions

    def rope(self, qk, state):
        cos, sin, positions = state
        t, heads, d = qk.shape
        if qk.dtype not in KERNEL_DTYPES or qk.dtype != cos.dtype or qk.stride(2) != 1 or qk.stride(1) != d:
            return apply_rope(qk, cos[positions].unsqueeze(1), sin[positions].unsqueeze(1))
        # the heads of a row are contiguous: the row as one [heads * d] vector
        self.k.rope_(qk.as_strided((t, heads * d), (qk.stride(0), 1)), heads, d, cos, sin, positions)
        return qk

    def silu_mul(self, gate_up):
        if gate_up.dtype not in KERNEL_DTYPES or not gate_up.is_contiguous():
            return super().silu_mul(gate_up)
        return self.k.silu_mul(gate_up)

    def fused_decode(self, layers, cos, sin, ends=None):
        from radixserve.runtime.models.fused_decode import FusedDecodeLayers
        return FusedDecodeLayers.of(self.k, layers, cos, sin, ends)
