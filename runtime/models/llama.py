"""One Llama-family decoder (Llama, Mistral, SmolLM, Qwen2, Qwen3) on the paged KV cache.

Plain tensors and functional ops: there is no training, and fewer Python layers per op
keep the CPU decode step short. q/k/v and gate/up projections are fused.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from radixserve.runtime.forward_batch import ForwardBatch
from radixserve.runtime.models.config import ModelConfig
from radixserve.runtime.models.rope import cos_sin_table
from radixserve.runtime.platform import Platform


class DecoderLayer:
    def __init__(self, cfg: ModelConfig, w: dict[str, torch.Tensor], index: int, quantized: dict,
                 platform: Platform, ops):
        p = f"model.layers.{index}."
        a = p + "self_attn."
        q = lambda *names: [quantized.get(n + ".weight") for n in names]  # noqa: E731
        linear = platform.linear
        qkv_w = torch.cat([w[a + "q_proj.weight"], w[a + "k_proj.weight"], w[a + "v_proj.weight"]])
        qkv_b = None
        if cfg.attention_bias:
            qkv_b = torch.cat([w[a + "q_proj.bias"], w[a + "k_proj.bias"], w[a + "v_proj.bias"]])
        self.qkv = linear(qkv_w, qkv_b, q(a + "q_proj", a + "k_proj", a + "v_proj"))
        self.o = linear(w[a + "o_proj.weight"], w.get(a + "o_proj.bias"), q(a + "o_proj"))
        self.q_norm = w[a + "q_norm.weight"] if cfg.qk_norm else None
        self.k_norm = w[a + "k_norm.weight"] if cfg.qk_norm else None
        m = p + "mlp."
        self.gate_up = linear(torch.cat([w[m + "gate_proj.weight"], w[m + "up_proj.weight"]]),
                              quantized_parts=q(m + "gate_proj", m + "up_proj"))
        self.down = linear(w[m + "down_proj.weight"], quantized_parts=q(m + "down_proj"))
        # norms run on the float32 residual stream: bf16 cannot carry this family's outlier activations
        self.input_norm = w[p + "input_layernorm.weight"].float()
        self.post_attn_norm = w[p + "post_attention_layernorm.weight"].float()
        self.dtype = qkv_w.dtype
        self.index = index
        self.eps = cfg.rms_norm_eps
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.heads, self.kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.ops = ops   # the model's one LayerOps

    def __call__(self, x: torch.Tensor, delta: Optional[torch.Tensor], rope_state, batch: ForwardBatch,
                 attn) -> tuple[torch.Tensor, torch.Tensor]:
        """x: the float32 residual stream before the previous layer's MLP output `delta` (None
        for the first layer) is added: each add is fused with the norm after it. Returns this
        layer's (x, delta)."""
        t, d, ops = x.shape[0], self.head_dim, self.ops
        x, h = ops.add_rms_norm(x, delta, self.input_norm, self.eps, self.dtype)
        qkv = self.qkv(h)
        # q and k are adjacent in the fused output: their heads are rotated in one call
        qk = qkv[:, : self.q_size + self.kv_size].view(t, self.heads + self.kv_heads, d)
        v = qkv[:, self.q_size + self.kv_size:].view(t, self.kv_heads, d)
        if self.q_norm is not None:
            qk = torch.cat([F.rms_norm(qk[:, : self.heads], (d,), self.q_norm, self.eps),
                            F.rms_norm(qk[:, self.heads:], (d,), self.k_norm, self.eps)], dim=1)
        qk = ops.rope(qk, rope_state)
        o = attn.forward(self.index, qk[:, : self.heads], qk[:, self.heads:], v, batch)
        x, h = ops.add_rms_norm(x, self.o(o.reshape(t, self.q_size)), self.post_attn_norm, self.eps, self.dtype)
        return x, self.down(ops.silu_mul(self.gate_up(h)))


class LlamaForCausalLM:
    def __init__(self, cfg: ModelConfig, weights: dict[str, torch.Tensor], dtype: torch.dtype,
                 platform: Platform, quantized: dict | None = None):
        """`quantized`: exact block-quantized forms of some weights (from GGUF files), which the
        platform may use in place of the dequantised weights."""
        self.cfg = cfg
        device = platform.device
        self.dtype, self.device = dtype, device
        w = {k: t.to(device=device, dtype=dtype) for k, t in weights.items()}
        self.embed = w["model.embed_tokens.weight"]
        self.ops = platform.layer_ops()
        quantized = quantized or {}
        self.layers = [DecoderLayer(cfg, w, i, quantized, platform, self.ops) for i in range(cfg.num_layers)]
        self.norm = w["model.norm.weight"].float()
        head = "model.embed_tokens.weight" if cfg.tie_word_embeddings or "lm_head.weight" not in w else "lm_head.weight"
        self.lm_head = platform.linear(w[head], quantized_parts=[quantized.get(head)])
        self.cos, self.sin = cos_sin_table(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling,
                                           cfg.max_context_len, dtype, device)
        self.fused_decode = self.ops.fused_decode(self.layers, self.cos, self.sin)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, attn) -> torch.Tensor:
        """Float32 logits of `batch.sample_rows` (all rows when None)."""
        x = F.embedding(batch.input_ids, self.embed).float()
        fused = None
        if self.fused_decode is not None and batch.paged_decode is not None:
            fused = self.fused_decode(x, batch.positions, batch.out_slots, batch.paged_decode)
        if fused is not None:
            x, delta = fused
        else:
            rope_state = self.ops.rope_positions(self.cos, self.sin, batch.positions)
            delta = None
            for layer in self.layers:
                x, delta = layer(x, delta, rope_state, batch, attn)
        if batch.sample_rows is not None:
            x, delta = x[batch.sample_rows], delta[batch.sample_rows]
        _, h = self.ops.add_rms_norm(x, delta, self.norm, self.cfg.rms_norm_eps, self.dtype)
        return self.lm_head(h).float()
