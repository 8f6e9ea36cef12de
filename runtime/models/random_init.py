"""Random weights under Hugging Face parameter names, for tests and benchmarks that need a model
of a given shape but not its trained values (nothing is downloaded)."""
from __future__ import annotations

import torch

from radixserve.runtime.models.config import ModelConfig


def random_weights(cfg: ModelConfig, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                   seed: int = 0, std: float = 0.02) -> dict[str, torch.Tensor]:
    """Normal(0, std) matrices and Uniform(0.5, 1.5) norm weights, made directly on `device`
    (an 8B model's weights never pass through host memory)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    h, d, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size

    def matrix(rows: int, cols: int) -> torch.Tensor:
        return (torch.randn(rows, cols, generator=gen, device=device, dtype=dtype) * std)

    def norm(n: int) -> torch.Tensor:
        return torch.rand(n, generator=gen, device=device, dtype=dtype) + 0.5

    w = {"model.embed_tokens.weight": matrix(cfg.vocab_size, h), "model.norm.weight": norm(h)}
    if not cfg.tie_word_embeddings:
        w["lm_head.weight"] = matrix(cfg.vocab_size, h)
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        w[p + "self_attn.q_proj.weight"] = matrix(cfg.num_heads * d, h)
        w[p + "self_attn.k_proj.weight"] = matrix(cfg.num_kv_heads * d, h)
        w[p + "self_attn.v_proj.weight"] = matrix(cfg.num_kv_heads * d, h)
        w[p + "self_attn.o_proj.weight"] = matrix(h, cfg.num_heads * d)
        w[p + "mlp.gate_proj.weight"] = matrix(inter, h)
        w[p + "mlp.up_proj.weight"] = matrix(inter, h)
        w[p + "mlp.down_proj.weight"] = matrix(h, inter)
        w[p + "input_layernorm.weight"] = norm(h)
        w[p + "post_attention_layernorm.weight"] = norm(h)
        if cfg.attention_bias:
            for name, rows in (("q", cfg.num_heads * d), ("k", cfg.num_kv_heads * d), ("v", cfg.num_kv_heads * d)):
                w[p + f"self_attn.{name}_proj.bias"] = torch.randn(rows, generator=gen, device=device, dtype=dtype) * std
        if cfg.qk_norm:
            w[p + "self_attn.q_norm.weight"] = norm(d)
            w[p + "self_attn.k_norm.weight"] = norm(d)
    return w
