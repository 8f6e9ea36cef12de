"""Write a GGUF of an HF Llama, Qwen3, Qwen3-MoE, Gemma 3, Phi-3 / 4 or gpt-oss in llama.cpp's layout, with the
default model's tokenizer: float32, or with every matrix but the embeddings and the router in a block type
(gpt-oss: its experts in MXFP4, as llama.cpp's converter writes them)."""
from __future__ import annotations

from pathlib import Path

import numpy as np


def permute_for_gguf(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter: rotate-half row order -> interleaved pairs."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_llama_gguf(hf_model, path: Path, default_files, quant: str | None = None) -> Path:
    import gguf
    from gguf.quants import quantize

    from radixserve.runtime.models.gguf_file import read_gguf
    from radixserve.runtime.models.loader import default_model_path

    cfg = hf_model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    arch = {"qwen3_moe": "qwen3moe", "qwen3": "qwen3", "gemma3_text": "gemma3", "phi3": "phi3",
            "gpt_oss": "gpt-oss"}.get(cfg.model_type, "llama")
    moe, gemma, oss = arch == "qwen3moe", arch == "gemma3", arch == "gpt-oss"
    w = gguf.GGUFWriter(str(path), arch)
    if moe:
        w.add_expert_count(cfg.num_experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    if oss:   # even layers windowed (llama.cpp fixes that, and the SwiGLU limit); YaRN as keys
        assert cfg.layer_types == ["sliding_attention" if i % 2 == 0 else "full_attention"
                                   for i in range(cfg.num_hidden_layers)] and cfg.swiglu_limit == 7.0
        w.add_expert_count(cfg.num_local_experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
        w.add_expert_feed_forward_length(cfg.intermediate_size)
        w.add_sliding_window(cfg.sliding_window)
        yarn = cfg.rope_parameters
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(yarn["factor"])
        w.add_rope_scaling_orig_ctx_len(yarn["original_max_position_embeddings"])
    if arch != "llama":
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if gemma:   # every n-th layer global, as the layer types say
        n = cfg.layer_types.index("full_attention") + 1
        assert all((t == "full_attention") == ((i + 1) % n == 0) for i, t in enumerate(cfg.layer_types))
        w.add_sliding_window(cfg.sliding_window)
        w.add_sliding_window_pattern(n)
        if cfg.final_logit_softcapping:
            w.add_final_logit_softcapping(cfg.final_logit_softcapping)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    rope = cfg.rope_parameters.get("full_attention", cfg.rope_parameters)
    w.add_rope_freq_base(float(rope["rope_theta"]))
    if arch == "phi3":   # LongRoPE as llama.cpp's converter writes it: factors as tensors, the rest as keys
        import math
        original = rope["original_max_position_embeddings"]
        factor = cfg.max_position_embeddings / original
        w.add_rope_dimension_count(int(head_dim * rope.get("partial_rotary_factor", 1.0)))
        w.add_rope_scaling_orig_ctx_len(original)
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(factor) / math.log(original)))
        w.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], dtype=np.float32))
        w.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], dtype=np.float32))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    fields, _ = read_gguf(default_model_path())
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(fields["tokenizer.ggml.pre"])
    w.add_token_list(fields["tokenizer.ggml.tokens"])
    w.add_token_types(fields["tokenizer.ggml.token_type"])
    w.add_token_merges(fields["tokenizer.ggml.merges"])
    w.add_eos_token_id(fields["tokenizer.ggml.eos_token_id"])
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
             "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
             "mlp.gate": "ffn_gate_inp", "self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up"}
    if gemma:
        names.update({"post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
                      "post_feedforward_layernorm": "post_ffw_norm"})
    if oss:
        names.update({"post_attention_layernorm": "post_attention_norm", "mlp.router": "ffn_gate_inp"})
    qtype = getattr(gguf.GGMLQuantizationType, quant) if quant else None

    def add(out: str, a: np.ndarray) -> None:
        if qtype is None or a.ndim < 2 or out.startswith("token_embd") or "ffn_gate_inp" in out or "norm" in out:
            w.add_tensor(out, np.ascontiguousarray(a))
        else:
            w.add_tensor(out, quantize(np.ascontiguousarray(a), qtype), raw_dtype=qtype)

    state = hf_model.state_dict()
    if moe:   # each layer's experts stacked: [experts, rows, cols], as llama.cpp writes them
        for layer in range(cfg.num_hidden_layers):
            p = f"model.layers.{layer}.mlp.experts."
            # transformers holds them fused: [experts, gate rows | up rows, hidden]
            gate, up = np.split(state.pop(p + "gate_up_proj").float().numpy(), 2, axis=1)
            add(f"blk.{layer}.ffn_gate_exps.weight", gate)
            add(f"blk.{layer}.ffn_up_exps.weight", up)
            add(f"blk.{layer}.ffn_down_exps.weight", state.pop(p + "down_proj").float().numpy())
    if oss:   # [experts, hidden, 2 * inter], gate and up interleaved -> stacked [experts, rows, cols] each
        mxfp4 = gguf.GGMLQuantizationType.MXFP4
        for layer in range(cfg.num_hidden_layers):
            p = f"model.layers.{layer}.mlp.experts."
            gate_up = state.pop(p + "gate_up_proj").float().transpose(1, 2).numpy()
            gate_up_b = state.pop(p + "gate_up_proj_bias").float().numpy()
            down = state.pop(p + "down_proj").float().transpose(1, 2).numpy()
            for kind, rows, bias in (("gate", gate_up[:, 0::2], gate_up_b[:, 0::2]),
                                     ("up", gate_up[:, 1::2], gate_up_b[:, 1::2]), ("down", down, None)):
                w.add_tensor(f"blk.{layer}.ffn_{kind}_exps.weight", quantize(np.ascontiguousarray(rows), mxfp4),
                             raw_dtype=mxfp4)
                w.add_tensor(f"blk.{layer}.ffn_{kind}_exps.bias",
                             np.ascontiguousarray(state.pop(p + "down_proj_bias").float().numpy() if bias is None else bias))
    for name, t in state.items():
        a = t.detach().float().numpy()
        if name == "model.embed_tokens.weight":
            out = "token_embd.weight"
        elif name == "model.norm.weight":
            out = "output_norm.weight"
            a = a + 1 if gemma else a
        elif name == "lm_head.weight":
            if cfg.tie_word_embeddings:
                continue
            out = "output.weight"
        elif name.endswith("self_attn.sinks"):
            out = f"blk.{name.split('.')[2]}.attn_sinks.weight"
        else:
            _, _, layer, *rest = name.split(".")
            module, kind = ".".join(rest[:-1]), rest[-1]
            out = f"blk.{layer}.{names[module]}.{kind}"
            if gemma and "norm" in module:
                a = a + 1   # llama.cpp's converter stores Gemma's (1 + weight)
            if module == "self_attn.q_proj" and arch == "llama":
                a = permute_for_gguf(a, cfg.num_attention_heads)
            elif module == "self_attn.k_proj" and arch == "llama":
                a = permute_for_gguf(a, cfg.num_key_value_heads)
        add(out, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
