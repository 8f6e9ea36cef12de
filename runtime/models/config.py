"""Architecture description of a Llama-family decoder, read from HF config.json or GGUF metadata."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

ARCHITECTURES = {
    # model_type -> (q/k/v bias, q/k RMSNorm)
    "llama": (False, False),
    "mistral": (False, False),
    "qwen2": (True, False),
    "qwen3": (False, True),
}


class UnsupportedModelError(ValueError):
    pass


@dataclass
class ModelConfig:
    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict[str, Any]] = None
    max_context_len: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    eos_token_ids: list[int] = field(default_factory=list)

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> "ModelConfig":
        model_type = d.get("model_type", "")
        if model_type not in ARCHITECTURES:
            arch = (d.get("architectures") or [model_type or "?"])[0]
            raise UnsupportedModelError(
                f"unsupported architecture {arch!r}: radixserve runs Llama, Mistral, SmolLM, Qwen2 and Qwen3 models")
        if d.get("hidden_act", "silu") != "silu":
            raise UnsupportedModelError(f"unsupported activation {d['hidden_act']!r}")
        bias, qk_norm = ARCHITECTURES[model_type]
        heads = d["num_attention_heads"]
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        rope_theta = d.get("rope_theta", rope.get("rope_theta", 10000.0))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        max_len = d.get("max_position_embeddings", 2048)
        window = d.get("sliding_window")
        if window and (model_type == "mistral" or d.get("use_sliding_window")):
            max_len = min(max_len, window)  # beyond the window our full attention would differ
        eos = d.get("eos_token_id")
        return cls(
            model_type=model_type,
            hidden_size=d["hidden_size"],
            num_layers=d["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads,
            intermediate_size=d["intermediate_size"],
            vocab_size=d["vocab_size"],
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta),
            rope_scaling=dict(rope) if rope_type != "default" else None,
            max_context_len=max_len,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=bool(d.get("attention_bias", bias)),
            qk_norm=qk_norm,
            eos_token_ids=[eos] if isinstance(eos, int) else list(eos or []),
        )
