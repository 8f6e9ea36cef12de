"""Rotary position embedding tables (default, linear, llama3, LongRoPE and YaRN scaling)."""
from __future__ import annotations

import math
from typing import Any, Optional

import torch

from radixserve.runtime.models.config import UnsupportedModelError


def inverse_frequencies(head_dim: int, theta: float, scaling: Optional[dict[str, Any]]) -> torch.Tensor:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    if not scaling:
        return inv_freq
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "factors":
        return inv_freq / torch.tensor(scaling["factors"], dtype=torch.float64)
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "llama3":
        factor = scaling["factor"]
        low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
        old_len = scaling.get("original_max_position_embeddings", 8192)
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        return torch.where(medium, smoothed, scaled)
    raise UnsupportedModelError(f"unsupported rope scaling {kind!r} (supported: linear, llama3, longrope, yarn)")


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 0.1 * mscale * math.log(factor) + 1.0 if factor > 1 else 1.0


def _yarn(head_dim: int, theta: float, scaling: dict[str, Any]) -> tuple[torch.Tensor, float]:
    """YaRN (gpt-oss): frequencies that turn more than `beta_fast` times over the original length
    keep their speed, those under `beta_slow` are divided by the factor, a linear ramp between;
    cos/sin scaled by an attention factor."""
    factor, original = scaling["factor"], scaling["original_max_position_embeddings"]
    attention = scaling.get("attention_factor")
    if attention is None:
        mscale, all_dims = scaling.get("mscale"), scaling.get("mscale_all_dim")
        attention = (_yarn_mscale(factor, mscale) / _yarn_mscale(factor, all_dims) if mscale and all_dims
                     else _yarn_mscale(factor))

    def dim_of(turns: float) -> float:   # the dimension whose frequency turns this often over `original`
        return head_dim * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_of(scaling.get("beta_fast") or 32), dim_of(scaling.get("beta_slow") or 1)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float64) - low) / (high - low if high != low else 0.001)).clamp(0, 1)
    base = theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    return (1.0 / (factor * base)) * ramp + (1.0 / base) * (1 - ramp), attention


def _longrope(head_dim: int, theta: float, scaling: dict[str, Any], positions: torch.Tensor
              ) -> tuple[torch.Tensor, float]:
    """Phi-3's LongRoPE: per-frequency divisors, the short ones within the pretraining length and
    the long ones past it, and cos/sin scaled by an attention factor. Chosen per position (as vLLM
    does), so a cached prefix never changes once the sequence grows past the original length;
    transformers switches every position at once, which agrees wherever the sequence is short."""
    original = scaling["original_max_position_embeddings"]
    factor = scaling.get("factor") or scaling.get("max_position_embeddings", original) / original
    attention = scaling.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    base = theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    short = 1.0 / (torch.tensor(scaling["short_factor"], dtype=torch.float64) * base)
    long = 1.0 / (torch.tensor(scaling["long_factor"], dtype=torch.float64) * base)
    freqs = torch.where((positions < original).unsqueeze(1), short, long)
    return positions.unsqueeze(1) * freqs, attention


def cos_sin_table(head_dim: int, theta: float, scaling, max_len: int, dtype: torch.dtype,
                  device) -> tuple[torch.Tensor, torch.Tensor]:
    """[max_len, head_dim] cos and signed sin in the layout `apply_rope` wants (cos twice; -sin
    then sin), computed in float64 then cast once."""
    positions = torch.arange(max_len, dtype=torch.float64)
    scale = 1.0
    kind = scaling.get("rope_type", scaling.get("type")) if scaling else None
    if kind in ("longrope", "su"):
        angles, scale = _longrope(head_dim, theta, scaling, positions)
    elif kind == "yarn":
        inv_freq, scale = _yarn(head_dim, theta, scaling)
        angles = torch.outer(positions, inv_freq)
    else:
        angles = torch.outer(positions, inverse_frequencies(head_dim, theta, scaling))
    cos, sin = angles.cos() * scale, angles.sin() * scale
    return (torch.cat([cos, cos], dim=-1).to(dtype=dtype, device=device),
            torch.cat([-sin, sin], dim=-1).to(dtype=dtype, device=device))


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, head_dim] in the rotate-half layout; cos/sin: [T, 1, head_dim] from
    `cos_sin_table`. x * cos + swap_halves(x) * sin: three ops, where splitting the halves takes
    eight (per-op overhead dominates a decode step on the CPU)."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), sin)
