"""Read a GGUF file: metadata -> ModelConfig and tokenizer; tensors under Hugging Face names, the
block-quantized ones as the file holds them (runtime/models/quant.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from radixserve.runtime.models.gguf_file import GGUFTensor, read_gguf_mapped
from radixserve.runtime.models.config import ARCHITECTURES, ModelConfig, UnsupportedModelError
from radixserve.runtime.models.loader import ModelFiles, ModelLoadError
from radixserve.runtime.models.quant import BlockTensor, is_block_kind
from radixserve.runtime.tokenizer import Tokenizer

_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
# llama.cpp architectures whose tensors map onto the names above -> our model_type (a llama file
# with experts is a Mixtral)
GGUF_ARCHITECTURES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3",
                      "qwen3moe": "qwen3_moe", "gemma3": "gemma3_text", "phi3": "phi3", "gpt-oss": "gpt_oss"}
# Gemma's four norms a layer: its ffn_norm is the MLP's input norm, the attention and MLP outputs
# have their own (llama.cpp's converter has already added Gemma's 1 to every norm weight)
_GEMMA_NAMES = {"ffn_norm": "pre_feedforward_layernorm", "post_attention_norm": "post_attention_layernorm",
                "post_ffw_norm": "post_feedforward_layernorm"}
# a MoE layer's router, and its experts stacked in one [experts, rows, cols] tensor each
_ROUTER = "ffn_gate_inp"
_EXPERTS = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


# Phi-3 keeps q/k/v and gate/up fused
_PHI3_NAMES = {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}
# gpt-oss: the MLP's input norm is its post_attention_norm; the router (and sinks) under its names
_GPT_OSS_NAMES = {"post_attention_norm": "post_attention_layernorm", "ffn_gate_inp": "mlp.router"}


def hf_name(gguf_name: str, arch: str = "llama") -> str | None:
    parts = gguf_name.split(".")
    names = {**_LAYER_NAMES, _ROUTER: "mlp.gate",
             **{"gemma3": _GEMMA_NAMES, "phi3": _PHI3_NAMES, "gpt-oss": _GPT_OSS_NAMES}.get(arch, {})}
    if gguf_name.endswith("attn_sinks.weight") and len(parts) == 4:   # a vector named without .weight
        return f"model.layers.{parts[1]}.self_attn.sinks"
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in names:
        return f"model.layers.{parts[1]}.{names[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[parts[0]]}.{parts[1]}"
    return None


def unpermute_rope(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (interleaved RoPE pairs -> rotate-half halves)."""
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def dense(t: GGUFTensor) -> np.ndarray:
    """A tensor of a plain type (the norms; every tensor of an F16 / F32 / BF16 file) as float32,
    or any block type dequantised by the gguf package's reference."""
    kind = t.tensor_type.name
    if kind in ("F32", "F16"):
        return t.data.astype(np.float32)
    from gguf.quants import dequantize as gguf_dequantize
    return np.asarray(gguf_dequantize(t.data, t.tensor_type), dtype=np.float32)


def config_from_fields(f: dict[str, Any], has_output: bool, vocab_size: int) -> ModelConfig:
    arch = f.get("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise UnsupportedModelError(f"unsupported GGUF architecture {arch!r}: radixserve runs "
                                    f"{', '.join(GGUF_ARCHITECTURES)} GGUF files")
    a = lambda k, d=None: f.get(f"{arch}.{k}", d)  # noqa: E731
    model_type = GGUF_ARCHITECTURES[arch]
    experts = a("expert_count", 0) or 0
    if experts and model_type == "llama":
        model_type = "mixtral"
    heads = a("attention.head_count")
    hidden = a("embedding_length")
    scaling = None
    kind = a("rope.scaling.type")
    if kind == "linear":
        scaling = {"rope_type": "linear", "factor": a("rope.scaling.factor")}
    elif kind == "yarn":
        # gpt-oss's own YaRN keeps the ramp's ends unrounded (transformers' `truncate`)
        scaling = {"rope_type": "yarn", "factor": a("rope.scaling.factor"),
                   "original_max_position_embeddings": a("rope.scaling.original_context_length"),
                   "beta_fast": a("rope.scaling.yarn_beta_fast", 32.0), "beta_slow": a("rope.scaling.yarn_beta_slow", 1.0),
                   "truncate": arch != "gpt-oss"}
    elif kind not in (None, "none"):
        raise UnsupportedModelError(f"unsupported rope scaling {kind!r} in GGUF")
    family = ARCHITECTURES[model_type]
    eos = f.get("tokenizer.ggml.eos_token_id")
    return ModelConfig(
        model_type=model_type, hidden_size=hidden, num_layers=a("block_count"), num_heads=heads,
        num_kv_heads=a("attention.head_count_kv", heads), head_dim=a("attention.key_length", hidden // heads),
        intermediate_size=a("feed_forward_length"), vocab_size=a("vocab_size", vocab_size),
        rms_norm_eps=a("attention.layer_norm_rms_epsilon", 1e-5), rope_theta=float(a("rope.freq_base", 10000.0)),
        rope_scaling=scaling, max_context_len=a("context_length", 2048), tie_word_embeddings=not has_output,
        attention_bias=family.attention_bias, qk_norm=family.qk_norm, eos_token_ids=[eos] if eos is not None else [],
        # llama.cpp renormalises the chosen experts' weights for both families
        num_experts=experts, experts_per_token=a("expert_used_count", 0) if experts else 0,
        moe_intermediate_size=a("expert_feed_forward_length") or a("feed_forward_length"), norm_topk_prob=True,
        rotary_dim=a("rope.dimension_count"),
        **(_gemma3(a) if arch == "gemma3" else _gpt_oss(a) if arch == "gpt-oss" else {}))


def _gemma3(a) -> dict[str, Any]:
    """What llama.cpp's gemma3 reads or fixes: every n-th layer global (6 unless the file says),
    local layers on RoPE base 10000, attention scaled by head_dim (the 27B's hidden / heads is
    not told apart here)."""
    layers, window = a("block_count"), a("attention.sliding_window")
    pattern = a("attention.sliding_window_pattern", 6)
    globals_ = ([not p for p in pattern] if isinstance(pattern, list)
                else [(i + 1) % pattern == 0 for i in range(layers)])
    head_dim = a("attention.key_length")
    return dict(hidden_act="gelu_tanh", layer_windows=tuple(0 if g else window for g in globals_),
                local_rope_theta=float(a("rope.freq_base_swa", 10000.0)), sandwich_norms=True, embed_scale=a("embedding_length") ** 0.5,
                query_pre_attn_scalar=float(head_dim), final_logit_softcap=a("final_logit_softcapping"))


def _gpt_oss(a) -> dict[str, Any]:
    """What llama.cpp's gpt-oss fixes rather than reads: even layers windowed, the experts'
    SwiGLU clamped at 7 with alpha 1.702."""
    window = a("attention.sliding_window")
    return dict(layer_windows=tuple(window if i % 2 == 0 else 0 for i in range(a("block_count"))),
                attention_sinks=True, swiglu_limit=7.0, swiglu_alpha=1.702)


def load_gguf(path: Path, name: str, with_weights: bool = True) -> ModelFiles:
    """The file's block-quantized matrices stay in its memory map (BlockTensors); plain tensors are
    read as float32 (norms, or a whole F16 file)."""
    try:
        fields, tensors, mapped = read_gguf_mapped(path)
    except Exception as e:
        raise ModelLoadError(f"{path} is not a readable GGUF file ({type(e).__name__}: {e})") from None
    vocab = len(fields.get("tokenizer.ggml.tokens", [])) or tensors["token_embd.weight"].shape[-1]
    config = config_from_fields(fields, "output.weight" in tensors, vocab)
    if "rope_factors_long.weight" in tensors:  # Phi-3's LongRoPE: both sets of divisors as tensors
        arch = fields["general.architecture"]
        config.rope_scaling = {
            "rope_type": "longrope", "long_factor": dense(tensors["rope_factors_long.weight"]).reshape(-1).tolist(),
            "short_factor": dense(tensors["rope_factors_short.weight"]).reshape(-1).tolist(),
            "original_max_position_embeddings": fields.get(f"{arch}.rope.scaling.original_context_length"),
            "attention_factor": fields.get(f"{arch}.rope.scaling.attn_factor"),
            "max_position_embeddings": config.max_context_len}
    if "rope_freqs.weight" in tensors:  # llama3-style scaling stored as per-frequency divisors
        factors = dense(tensors["rope_freqs.weight"])
        config.rope_scaling = {"rope_type": "factors", "factors": np.asarray(factors).reshape(-1).tolist()}
    weights: dict[str, torch.Tensor | BlockTensor] = {}
    try:
        for gname, t in (tensors.items() if with_weights else ()):
            if gname.split(".")[2:3] and gname.split(".")[2] in _EXPERTS:
                weights.update(_experts(gname, t, config.num_experts))
                continue
            hname = hf_name(gname, fields.get("general.architecture"))
            if hname is None:
                continue
            heads = None
            if config.model_type in ("llama", "mistral", "mixtral"):
                if gname.endswith("attn_q.weight") or gname.endswith("attn_q.bias"):
                    heads = config.num_heads
                elif gname.endswith("attn_k.weight") or gname.endswith("attn_k.bias"):
                    heads = config.num_kv_heads
            shape = [int(d) for d in reversed(t.shape)]
            if is_block_kind(t.tensor_type.name) and len(shape) == 2 and not hname.endswith(("mlp.gate.weight", "mlp.router.weight")):
                w = BlockTensor(t.tensor_type.name, t.data, shape[1])
                weights[hname] = w.reordered(unpermute_rope(np.arange(w.rows), heads)) if heads else w
                continue
            a = dense(t).reshape(shape)
            if heads:
                a = unpermute_rope(a, heads)
            weights[hname] = torch.from_numpy(a if a.flags.writeable else a.copy())
    except (ValueError, NotImplementedError) as e:
        raise ModelLoadError(f"cannot read the weights of {path.name}: {e}") from None
    return ModelFiles(name, config, weights, Tokenizer.from_gguf_fields(fields), mapped if with_weights else None)


def _experts(gname: str, t: GGUFTensor, num_experts: int) -> dict[str, torch.Tensor | BlockTensor]:
    """One stacked expert tensor (blk.N.ffn_*_exps, [experts, rows, cols], or gpt-oss's biases
    [experts, rows]) as each expert's own under Hugging Face's names: views of the file's rows,
    never copies of a block type (gpt-oss's MXFP4 included)."""
    _, layer, kind, suffix = gname.split(".")
    experts, rows, *cols = (int(d) for d in reversed(t.shape))
    if experts != num_experts:
        raise ValueError(f"{gname} holds {experts} experts, the metadata says {num_experts}")
    out: dict[str, torch.Tensor | BlockTensor] = {}
    n = rows if cols else 1   # a row of the file's data per matrix row, one per bias
    for e in range(experts):
        name = f"model.layers.{layer}.mlp.experts.{e}.{_EXPERTS[kind]}.{suffix}"
        part = t.data[e * n:(e + 1) * n]
        if cols and is_block_kind(t.tensor_type.name):
            out[name] = BlockTensor(t.tensor_type.name, part, cols[0])
        else:
            a = dense(GGUFTensor(gname, tuple(reversed([rows, *cols])), t.tensor_type, part)).reshape(rows, *cols)
            out[name] = torch.from_numpy(a if a.flags.writeable else a.copy())
    return out
