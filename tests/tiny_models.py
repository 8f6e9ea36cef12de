"""Tiny random-weight models of each supported architecture, saved the way Hugging Face saves them."""
from __future__ import annotations

from pathlib import Path

import torch

VOCAB = 49152  # the default model's tokenizer, so the directories are complete models


def tiny_config(arch: str):
    import transformers as tf

    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  rms_norm_eps=1e-5, tie_word_embeddings=False)
    if arch == "llama":
        rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
        return tf.LlamaConfig(**common, rope_parameters=rope)
    if arch == "llama_tied":
        return tf.LlamaConfig(**{**common, "tie_word_embeddings": True}, rope_theta=50000.0)
    if arch == "qwen2":
        return tf.Qwen2Config(**common, rope_theta=1000000.0)
    if arch == "qwen3":
        return tf.Qwen3Config(**common, head_dim=32, rope_theta=1000000.0)  # head_dim != hidden / heads
    if arch in ("phi3", "phi4_mini"):
        # LongRoPE's short factors (the sequences here stay within the original length) and its
        # attention factor; Phi-4-mini also turns only 3/4 of each head and ties its embeddings
        partial = 0.75 if arch == "phi4_mini" else 1.0
        pairs = int(16 * partial) // 2
        rope = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": partial,
                "short_factor": [1.0 + 0.25 * i for i in range(pairs)],
                "long_factor": [2.0 + i for i in range(pairs)], "original_max_position_embeddings": 64}
        return tf.Phi3Config(**{**common, "tie_word_embeddings": arch == "phi4_mini"}, pad_token_id=0,
                             rope_parameters=rope, original_max_position_embeddings=64)
    if arch == "mixtral":
        return tf.MixtralConfig(**common, num_local_experts=4, num_experts_per_tok=2)
    if arch == "qwen3_moe":
        # the second layer keeps a dense MLP; top-k probabilities are not renormalised
        return tf.Qwen3MoeConfig(**common, head_dim=32, num_experts=4, num_experts_per_tok=2,
                                 moe_intermediate_size=48, mlp_only_layers=[1], norm_topk_prob=False)
    if arch == "qwen3_moe_gguf":
        # what llama.cpp's qwen3moe runs: experts in every layer, chosen weights renormalised
        return tf.Qwen3MoeConfig(**common, head_dim=32, num_experts=4, num_experts_per_tok=2,
                                 moe_intermediate_size=64, norm_topk_prob=True)
    if arch == "gemma3_gguf":
        # what llama.cpp's gemma3 reads: attention scaled by head_dim, every n-th layer global
        return tiny_config("gemma3").__class__(**{**tiny_config("gemma3").to_dict(), "query_pre_attn_scalar": 16})
    if arch == "gemma3":
        # a window of 4 over a 12-token prompt, local and global layers with their own RoPE bases,
        # final logit soft-capping and a query scale other than head_dim's
        rope = {"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}
        return tf.Gemma3TextConfig(**{**common, "tie_word_embeddings": True}, head_dim=16, sliding_window=4,
                                   layer_types=["sliding_attention", "full_attention"], rope_parameters=rope,
                                   query_pre_attn_scalar=24, final_logit_softcapping=30.0, pad_token_id=0)
    if arch == "gpt_oss_gguf":
        # what llama.cpp's gpt-oss fixes: even layers windowed, the SwiGLU limit at 7
        return tiny_config("gpt_oss").__class__(**{**tiny_config("gpt_oss").to_dict(), "swiglu_limit": 7.0})
    if arch == "gpt_oss":
        # sinks, a window of 4 on alternate layers, YaRN, and an expert limit low enough to clamp
        rope = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                "original_max_position_embeddings": 64, "truncate": False}
        return tf.GptOssConfig(**common, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=4,
                               layer_types=["sliding_attention", "full_attention"], rope_parameters=rope,
                               swiglu_limit=1.0)
    raise ValueError(arch)


def build_tiny_model(arch: str, directory: Path, tokenizer, seed: int = 0):
    """Save a random model of `arch` (with the given tokenizer) to `directory`; return the HF model."""
    import transformers as tf

    torch.manual_seed(seed)
    cfg = tiny_config(arch)
    model = tf.AutoModelForCausalLM.from_config(cfg).float().eval()
    with torch.no_grad():  # larger than default init, so the logits differ enough to catch mistakes
        for p in model.parameters():
            p.normal_(0.0, 0.08) if p.dim() > 1 else p.uniform_(0.5, 1.5)
        if arch == "gpt_oss_gguf":   # experts as a GGUF holds them: values MXFP4 represents exactly
            for name, p in model.named_parameters():
                if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                    p.copy_(mxfp4_round_trip(p.transpose(1, 2)).transpose(1, 2))
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save(directory)
    return model


def mxfp4_round_trip(t: torch.Tensor) -> torch.Tensor:
    """t's rows (blocks of 32 along the last dim) quantised to MXFP4 and back, by the gguf package."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    kind = GGMLQuantizationType.MXFP4
    a = t.detach().float().reshape(-1, t.shape[-1]).numpy()
    return torch.from_numpy(dequantize(quantize(a, kind), kind)).reshape(t.shape)
