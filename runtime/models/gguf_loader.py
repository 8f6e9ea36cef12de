"""Read a GGUF file: metadata -> ModelConfig and tokenizer, tensors dequantised to float32
under Hugging Face names."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from radixserve.runtime.models.gguf_file import GGUFTensor, read_gguf
from radixserve.runtime.models.config import ARCHITECTURES, ModelConfig, UnsupportedModelError
from radixserve.runtime.models.loader import Int4Weight, Int8Weight, ModelFiles, ModelLoadError
from radixserve.runtime.tokenizer import Tokenizer

_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def hf_name(gguf_name: str) -> str | None:
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[parts[0]]}.{parts[1]}"
    return None


def unpermute_rope(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (interleaved RoPE pairs -> rotate-half halves)."""
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def int4_from_blocks(data: np.ndarray, kind: str, rows: int, cols: int) -> Int4Weight:
    """Q4_0 / Q4_1 blocks of 32 -> (q, scale, zero) with w = (q - 8) * scale + zero, exactly."""
    block = 18 if kind == "Q4_0" else 20
    b = np.ascontiguousarray(data).reshape(rows, cols // 32, block)
    d = b[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    if kind == "Q4_0":           # w = d * (q - 8)
        zero, qs = np.zeros_like(d), b[..., 2:]
    else:                        # w = d * q + m = (q - 8) * d + (m + 8 d)
        m = b[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        zero, qs = m + 8 * d, b[..., 4:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(rows, cols)
    return Int4Weight(q.astype(np.uint8), d, zero, 32)


def int8_from_blocks(data: np.ndarray, rows: int, cols: int) -> Int8Weight:
    """Q8_0 blocks of 32 -> (q, scale) with w = q * scale, exactly."""
    b = np.ascontiguousarray(data).reshape(rows, cols // 32, 34)
    d = b[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    return Int8Weight(np.ascontiguousarray(b[..., 2:]).view(np.int8).reshape(rows, cols), d)


def quantized_form(t: GGUFTensor, rows: int, cols: int) -> Int4Weight | Int8Weight | None:
    kind = t.tensor_type.name
    if kind in ("Q4_0", "Q4_1"):
        return int4_from_blocks(t.data, kind, rows, cols)
    return int8_from_blocks(t.data, rows, cols) if kind == "Q8_0" else None


def dequantize(t: GGUFTensor) -> np.ndarray:
    """float32, rows x cols. The types the default model uses in numpy (whole-array ops); the rest
    through the gguf package's per-block loops."""
    kind = t.tensor_type.name
    if kind in ("Q4_0", "Q4_1") and t.data.ndim == 2:
        rows, cols = t.data.shape[0], t.shape[0]
        q4 = int4_from_blocks(t.data, kind, rows, cols)
        groups = q4.q.reshape(rows, cols // 32, 32).astype(np.float32) - 8.0
        return (groups * q4.scale[..., None] + q4.zero[..., None]).reshape(rows, cols)
    if kind == "Q8_0" and t.data.ndim == 2:
        q8 = int8_from_blocks(t.data, t.data.shape[0], t.shape[0])
        rows, cols = q8.q.shape
        return (q8.q.reshape(rows, cols // 32, 32).astype(np.float32) * q8.scale[..., None]).reshape(rows, cols)
    if kind in ("F32", "F16"):
        return t.data.astype(np.float32)
    from gguf.quants import dequantize as gguf_dequantize
    return np.asarray(gguf_dequantize(t.data, t.tensor_type), dtype=np.float32)


def config_from_fields(f: dict[str, Any], has_output: bool, vocab_size: int) -> ModelConfig:
    arch = f.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise UnsupportedModelError(
            f"unsupported GGUF architecture {arch!r}: radixserve runs llama, qwen2 and qwen3 GGUF files")
    a = lambda k, d=None: f.get(f"{arch}.{k}", d)  # noqa: E731
    heads = a("attention.head_count")
    hidden = a("embedding_length")
    scaling = None
    kind = a("rope.scaling.type")
    if kind == "linear":
        scaling = {"rope_type": "linear", "factor": a("rope.scaling.factor")}
    elif kind not in (None, "none"):
        raise UnsupportedModelError(f"unsupported rope scaling {kind!r} in GGUF")
    bias, qk_norm = ARCHITECTURES[arch]
    eos = f.get("tokenizer.ggml.eos_token_id")
    return ModelConfig(
        model_type=arch, hidden_size=hidden, num_layers=a("block_count"), num_heads=heads,
        num_kv_heads=a("attention.head_count_kv", heads), head_dim=a("attention.key_length", hidden // heads),
        intermediate_size=a("feed_forward_length"), vocab_size=a("vocab_size", vocab_size),
        rms_norm_eps=a("attention.layer_norm_rms_epsilon", 1e-5), rope_theta=float(a("rope.freq_base", 10000.0)),
        rope_scaling=scaling, max_context_len=a("context_length", 2048), tie_word_embeddings=not has_output,
        attention_bias=bias, qk_norm=qk_norm, eos_token_ids=[eos] if eos is not None else [])


def load_gguf(path: Path, name: str, with_weights: bool = True) -> ModelFiles:
    try:
        fields, tensors = read_gguf(path)
    except Exception as e:
        raise ModelLoadError(f"{path} is not a readable GGUF file ({type(e).__name__}: {e})") from None
    vocab = len(fields.get("tokenizer.ggml.tokens", [])) or tensors["token_embd.weight"].shape[-1]
    config = config_from_fields(fields, "output.weight" in tensors, vocab)
    if "rope_freqs.weight" in tensors:  # llama3-style scaling stored as per-frequency divisors
        factors = dequantize(tensors["rope_freqs.weight"])
        config.rope_scaling = {"rope_type": "factors", "factors": np.asarray(factors).reshape(-1).tolist()}
    weights: dict[str, torch.Tensor] = {}
    quantized: dict[str, Int4Weight | Int8Weight] = {}
    try:
        for gname, t in (tensors.items() if with_weights else ()):
            hname = hf_name(gname)
            if hname is None:
                continue
            w = dequantize(t)
            w = w.reshape([int(d) for d in reversed(t.shape)])
            q = quantized_form(t, *w.shape) if w.ndim == 2 else None
            heads = None
            if config.model_type in ("llama", "mistral"):
                if gname.endswith("attn_q.weight") or gname.endswith("attn_q.bias"):
                    heads = config.num_heads
                elif gname.endswith("attn_k.weight") or gname.endswith("attn_k.bias"):
                    heads = config.num_kv_heads
            if heads:
                w = unpermute_rope(w, heads)
                if isinstance(q, Int4Weight):
                    q = Int4Weight(*(unpermute_rope(a, heads) for a in (q.q, q.scale, q.zero)), q.group)
                elif isinstance(q, Int8Weight):
                    q = Int8Weight(*(unpermute_rope(a, heads) for a in (q.q, q.scale)))
            weights[hname] = torch.from_numpy(w if w.flags.writeable else w.copy())
            if q is not None:
                quantized[hname] = q
    except (ValueError, NotImplementedError) as e:
        raise ModelLoadError(f"cannot dequantise {path.name}: {e}") from None
    return ModelFiles(name, config, weights, Tokenizer.from_gguf_fields(fields), quantized)
