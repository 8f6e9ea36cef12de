"""Architecture description of a decoder family, read from HF config.json or GGUF metadata."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass(frozen=True)
class Family:
    """What a model_type adds to the Llama decoder (runtime/models/llama.py)."""
    attention_bias: bool = False
    qk_norm: bool = False
    moe: bool = False          # sparse mixture-of-experts MLPs (runtime/models/moe.py)


ARCHITECTURES = {
    "llama": Family(),
    "mistral": Family(),
    "qwen2": Family(attention_bias=True),
    "qwen3": Family(qk_norm=True),
    "phi3": Family(),          # fused qkv / gate-up weights, partial rotary, LongRoPE
    "mixtral": Family(moe=True),
    "qwen3_moe": Family(qk_norm=True, moe=True),
    # norms that add 1, sandwich norms, GeGLU, scaled embeddings, local sliding-window layers
    "gemma3_text": Family(qk_norm=True),
    # attention sinks, alternating sliding-window layers, YaRN, biased router and clamped SwiGLU experts
    "gpt_oss": Family(attention_bias=True, moe=True),
}
SUPPORTED = "Llama, Mistral, SmolLM, Qwen2, Qwen3, Phi-3/4, Mixtral, Qwen3-MoE, Gemma 3 (text) and gpt-oss"
ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}


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
    rotary_dim: Optional[int] = None     # leading dims of each head that rotate (partial rotary); None: all
    num_experts: int = 0                 # > 0: sparse MoE MLPs
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True          # renormalise the chosen experts' router probabilities
    dense_layers: tuple[int, ...] = ()   # layers of a MoE model with a dense MLP instead
    hidden_act: str = "silu"             # the gated MLP's activation: silu, or gelu_tanh (GeGLU)
    layer_windows: tuple[int, ...] = ()  # per layer, the sliding window it attends (0: all); () all global
    local_rope_theta: Optional[float] = None   # the windowed layers' own RoPE base (Gemma 3)
    norm_weight_offset: float = 0.0      # Gemma's RMSNorm multiplies by (1 + weight)
    sandwich_norms: bool = False         # attention and MLP outputs normed before the residual adds
    embed_scale: float = 1.0             # embeddings times this (Gemma: sqrt(hidden))
    query_pre_attn_scalar: Optional[float] = None   # attention scales by this ** -0.5, not head_dim's
    final_logit_softcap: Optional[float] = None     # logits = cap * tanh(logits / cap)
    attention_sinks: bool = False        # a learned logit per head joins each softmax (gpt-oss)
    swiglu_limit: Optional[float] = None # gpt-oss experts: clamped SwiGLU with this limit ...
    swiglu_alpha: float = 1.0            # ... and sigmoid(alpha * gate)

    def __post_init__(self):
        if self.rotary_dim is None:
            self.rotary_dim = self.head_dim

    def window(self, i: int) -> Optional[int]:
        """Layer i's sliding window, or None where it attends to the whole context."""
        return (self.layer_windows[i] or None) if self.layer_windows else None

    @property
    def num_windowed_layers(self) -> int:
        return sum(1 for w in self.layer_windows if w)

    @property
    def sliding_window(self) -> Optional[int]:
        """The window of the windowed layers (one size per model), None if every layer is global."""
        sizes = {w for w in self.layer_windows if w}
        if len(sizes) > 1:
            raise UnsupportedModelError(f"sliding windows of several sizes ({sorted(sizes)})")
        return sizes.pop() if sizes else None

    def is_moe_layer(self, i: int) -> bool:
        return self.num_experts > 0 and i not in self.dense_layers

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> "ModelConfig":
        model_type = d.get("model_type", "")
        if model_type not in ARCHITECTURES:
            arch = (d.get("architectures") or [model_type or "?"])[0]
            raise UnsupportedModelError(f"unsupported architecture {arch!r}: radixserve runs {SUPPORTED} models")
        act = d.get("hidden_activation") or d.get("hidden_act") or "silu"
        if act not in ACTIVATIONS:
            raise UnsupportedModelError(f"unsupported activation {act!r}")
        if d.get("attn_logit_softcapping"):
            raise UnsupportedModelError("attention logit soft-capping (Gemma 2) is not supported")
        family = ARCHITECTURES[model_type]
        heads = d["num_attention_heads"]
        head_dim = d.get("head_dim") or d["hidden_size"] // heads
        rope = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
        local_rope = None
        if "full_attention" in rope:   # per layer type (transformers 5: Gemma 3)
            local_rope, rope = rope.get("sliding_attention") or {}, dict(rope["full_attention"] or {})
        rope_theta = d.get("rope_theta", rope.get("rope_theta", 10000.0))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        partial = rope.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0))
        max_len = d.get("max_position_embeddings", 2048)
        if rope_type in ("longrope", "su"):
            rope.setdefault("original_max_position_embeddings", d.get("original_max_position_embeddings", max_len))
            rope.setdefault("max_position_embeddings", max_len)
        window = d.get("sliding_window")
        if window and (model_type in ("mistral", "mixtral", "phi3") or d.get("use_sliding_window")):
            max_len = min(max_len, window)  # beyond the window our full attention would differ
        windows = ()
        if model_type == "gemma3_text":
            windows = tuple(window if t == "sliding_attention" else 0 for t in _gemma3_layer_types(d))
        elif d.get("layer_types") and window:
            windows = tuple(window if t == "sliding_attention" else 0 for t in d["layer_types"])
        eos = d.get("eos_token_id")
        experts = d.get("num_local_experts", d.get("num_experts", 0)) if family.moe else 0
        step = d.get("decoder_sparse_step", 1) or 1
        dense_layers = tuple(i for i in range(d["num_hidden_layers"])
                             if i in d.get("mlp_only_layers", []) or (i + 1) % step)
        return cls(
            model_type=model_type,
            hidden_size=d["hidden_size"],
            num_layers=d["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=d.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            intermediate_size=d["intermediate_size"],
            vocab_size=d["vocab_size"],
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta),
            rope_scaling=dict(rope) if rope_type != "default" else None,
            max_context_len=max_len,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=bool(d.get("attention_bias", family.attention_bias)),
            qk_norm=family.qk_norm,
            eos_token_ids=[eos] if isinstance(eos, int) else list(eos or []),
            rotary_dim=int(head_dim * partial),
            num_experts=experts,
            experts_per_token=d.get("num_experts_per_tok", 0) if experts else 0,
            moe_intermediate_size=d.get("moe_intermediate_size") or d["intermediate_size"],
            # Mixtral always renormalises; Qwen3-MoE says so in its config
            norm_topk_prob=bool(d.get("norm_topk_prob", True)),
            dense_layers=dense_layers if experts else (),
            hidden_act=ACTIVATIONS[act],
            layer_windows=windows,
            **(_gemma3(d, local_rope) if model_type == "gemma3_text" else {}),
            **(_gpt_oss(d) if model_type == "gpt_oss" else {}),
        )


def _gemma3_layer_types(d: dict[str, Any]) -> list[str]:
    """Older Gemma 3 configs give a pattern: every n-th layer global, the rest sliding."""
    if d.get("layer_types"):
        return list(d["layer_types"])
    n = d.get("sliding_window_pattern") or d.get("_sliding_window_pattern") or 6
    return ["full_attention" if (i + 1) % n == 0 else "sliding_attention" for i in range(d["num_hidden_layers"])]


def _gemma3(d: dict[str, Any], local_rope: Optional[dict[str, Any]]) -> dict[str, Any]:
    local = (local_rope or {}).get("rope_theta", d.get("rope_local_base_freq", 10000.0))
    if local_rope and local_rope.get("rope_type", "default") != "default":
        raise UnsupportedModelError(f"unsupported rope scaling {local_rope['rope_type']!r} on local layers")
    return dict(local_rope_theta=float(local), norm_weight_offset=1.0, sandwich_norms=True,
                embed_scale=d["hidden_size"] ** 0.5, query_pre_attn_scalar=float(d.get("query_pre_attn_scalar", 256)),
                final_logit_softcap=d.get("final_logit_softcapping"))


def _gpt_oss(d: dict[str, Any]) -> dict[str, Any]:
    return dict(attention_sinks=True, swiglu_limit=float(d.get("swiglu_limit", 7.0)),
                swiglu_alpha=float(d.get("swiglu_alpha", 1.702)))
