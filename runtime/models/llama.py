"""One Llama-shaped decoder on the paged KV cache: Llama, Mistral, SmolLM, Qwen2 / Qwen3, Phi-3 / 4
(fused weights, partial rotary) and the sparse-MoE Mixtral and Qwen3-MoE.

Plain tensors and functional ops: there is no training, and fewer Python layers per op
keep the CPU decode step short. q/k/v and gate/up projections are fused.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from radixserve.runtime.forward_batch import ForwardBatch
from radixserve.runtime.models.config import ModelConfig
from radixserve.runtime.models.moe import SparseMoE
from radixserve.runtime.models.rope import cos_sin_table
from radixserve.runtime.platform import Platform


class DecoderLayer:
    def __init__(self, cfg: ModelConfig, w: dict, index: int, dtype: torch.dtype, platform: Platform, ops):
        """`w`: the model's weights (dense tensors, or a GGUF file's BlockTensors for matrices)."""
        p = f"model.layers.{index}."
        a = p + "self_attn."
        linear = lambda names, bias=None: platform.linear([w[n + ".weight"] for n in names], bias, dtype)  # noqa: E731
        qkv_b = None
        if cfg.attention_bias:
            qkv_b = torch.cat([w[a + "q_proj.bias"], w[a + "k_proj.bias"], w[a + "v_proj.bias"]])
        # Phi-3 stores q/k/v and gate/up already fused
        self.qkv = linear([a + "qkv_proj"] if a + "qkv_proj.weight" in w else [a + "q_proj", a + "k_proj", a + "v_proj"],
                          qkv_b)
        self.o = linear([a + "o_proj"], w.get(a + "o_proj.bias"))
        dense = lambda name: w[name].to(platform.device, dtype)  # noqa: E731
        self.q_norm = dense(a + "q_norm.weight") if cfg.qk_norm else None
        self.k_norm = dense(a + "k_norm.weight") if cfg.qk_norm else None
        self.gate_up = self.down = self.moe = None
        if cfg.is_moe_layer(index):
            self.moe = _sparse_moe(cfg, w, p, linear, ops, platform)
        else:
            m = p + "mlp."
            self.gate_up = linear([m + "gate_up_proj"] if m + "gate_up_proj.weight" in w else [m + "gate_proj", m + "up_proj"])
            self.down = linear([m + "down_proj"])
        # norms run on the float32 residual stream: bf16 cannot carry this family's outlier activations
        self.input_norm = w[p + "input_layernorm.weight"].to(platform.device, torch.float32)
        self.post_attn_norm = w[p + "post_attention_layernorm.weight"].to(platform.device, torch.float32)
        self.dtype = dtype
        self.index = index
        self.eps = cfg.rms_norm_eps
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.heads, self.kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.rotary_dim = cfg.rotary_dim
        self.ops = ops   # the model's one LayerOps
        # what the whole-layer decode kernel does (runtime/models/fused_decode.py)
        self.fusable = self.q_norm is None and self.moe is None and self.rotary_dim == self.head_dim

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
        if self.rotary_dim < d:   # partial rotary: the leading dims of each head turn, the rest pass
            r = self.rotary_dim
            qk = torch.cat([ops.rope(qk[..., :r].contiguous(), rope_state), qk[..., r:]], dim=-1)
        else:
            qk = ops.rope(qk, rope_state)
        o = attn.forward(self.index, qk[:, : self.heads], qk[:, self.heads:], v, batch)
        x, h = ops.add_rms_norm(x, self.o(o.reshape(t, self.q_size)), self.post_attn_norm, self.eps, self.dtype)
        if self.moe is not None:
            return x, self.moe(h)
        return x, self.down(ops.silu_mul(self.gate_up(h)))


def _sparse_moe(cfg: ModelConfig, w: dict, p: str, linear, ops, platform: Platform) -> SparseMoE:
    """Layer `p`'s experts under Mixtral's names (block_sparse_moe, w1 / w3 / w2) or Qwen3-MoE's."""
    if p + "block_sparse_moe.gate.weight" in w:
        m, names = p + "block_sparse_moe.", ("w1", "w3", "w2")
    else:
        m, names = p + "mlp.", ("gate_proj", "up_proj", "down_proj")
    gate, up, down = names
    experts = [(linear([f"{m}experts.{e}.{gate}", f"{m}experts.{e}.{up}"]), linear([f"{m}experts.{e}.{down}"]))
               for e in range(cfg.num_experts)]
    router = w[m + "gate.weight"].to(platform.device, torch.float32)
    return SparseMoE(router, experts, cfg.experts_per_token, cfg.norm_topk_prob, ops)


class LlamaForCausalLM:
    def __init__(self, cfg: ModelConfig, weights: dict, dtype: torch.dtype, platform: Platform):
        """`weights`: Hugging Face names -> dense tensors, or (matrices of a GGUF file) BlockTensors,
        which the platform runs on its block kernels or dequantises."""
        self.cfg = cfg
        device = platform.device
        self.dtype, self.device = dtype, device
        self.embed = platform.embedding(weights["model.embed_tokens.weight"], dtype)
        self.ops = platform.layer_ops()
        self.layers = [DecoderLayer(cfg, weights, i, dtype, platform, self.ops) for i in range(cfg.num_layers)]
        self.norm = weights["model.norm.weight"].to(device, torch.float32)
        head = ("model.embed_tokens.weight" if cfg.tie_word_embeddings or "lm_head.weight" not in weights
                else "lm_head.weight")
        self.lm_head = platform.linear([weights[head]], None, dtype)
        self.cos, self.sin = cos_sin_table(cfg.rotary_dim, cfg.rope_theta, cfg.rope_scaling,
                                           cfg.max_context_len, dtype, device)
        self.fused_decode = self.ops.fused_decode(self.layers, self.cos, self.sin)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, attn) -> torch.Tensor:
        """Float32 logits of `batch.sample_rows` (all rows when None)."""
        x = self.embed(batch.input_ids)
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
