"""One Llama-shaped decoder on the paged KV cache: Llama, Mistral, SmolLM, Qwen2 / Qwen3, Phi-3 / 4
(fused weights, partial rotary), Gemma 3 (sandwich norms, GeGLU, sliding windows), and the
sparse-MoE Mixtral, Qwen3-MoE and gpt-oss (attention sinks).

Plain tensors and functional ops: there is no training, and fewer Python layers per op
keep the CPU decode step short. q/k/v and gate/up projections are fused.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from radixserve.runtime.forward_batch import ForwardBatch
from radixserve.runtime.models.config import ModelConfig
from radixserve.runtime.models.moe import SWIGLU, SparseMoE, clamped_swiglu
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
        # Gemma's 1 is added in float32, as transformers does, whatever the checkpoint's dtype
        norm = lambda name, dt=dtype: (w[name].float() + cfg.norm_weight_offset).to(platform.device, dt)  # noqa: E731
        self.q_norm = norm(a + "q_norm.weight") if cfg.qk_norm else None
        self.k_norm = norm(a + "k_norm.weight") if cfg.qk_norm else None
        self.gate_up = self.down = self.moe = None
        if cfg.is_moe_layer(index):
            self.moe = _sparse_moe(cfg, w, p, linear, platform, dtype)
        else:
            m = p + "mlp."
            self.gate_up = linear([m + "gate_up_proj"] if m + "gate_up_proj.weight" in w else [m + "gate_proj", m + "up_proj"])
            self.down = linear([m + "down_proj"])
        # norms run on the float32 residual stream: bf16 cannot carry this family's outlier activations
        f32 = torch.float32
        self.input_norm = norm(p + "input_layernorm.weight", f32)
        # Gemma's sandwich: the attention output is normed (its "post_attention" norm) before the
        # residual add, the MLP's input by a "pre_feedforward" one, and its output normed too
        self.attn_out_norm = self.mlp_out_norm = None
        if cfg.sandwich_norms:
            self.attn_out_norm = norm(p + "post_attention_layernorm.weight", f32)
            self.post_attn_norm = norm(p + "pre_feedforward_layernorm.weight", f32)
            self.mlp_out_norm = norm(p + "post_feedforward_layernorm.weight", f32)
        else:
            self.post_attn_norm = norm(p + "post_attention_layernorm.weight", f32)
        self.act = cfg.hidden_act
        self.window = cfg.window(index)
        # gpt-oss: a learned logit per query head that joins each softmax (attention sinks)
        self.sinks = w[a + "sinks"].to(platform.device, torch.float32) if cfg.attention_sinks else None
        self.local_rope = self.window is not None and cfg.local_rope_theta is not None
        # the backend scales scores by head_dim ** -0.5; another scale is folded into q
        self.q_scale = (cfg.head_dim / cfg.query_pre_attn_scalar) ** 0.5 if cfg.query_pre_attn_scalar else None
        self.dtype = dtype
        self.index = index
        self.eps = cfg.rms_norm_eps
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.heads, self.kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.rotary_dim = cfg.rotary_dim
        self.ops = ops   # the model's one LayerOps
        # what the whole-layer decode kernel does (runtime/models/fused_decode.py)
        # (a MoE layer's part: up to its experts' normed input)
        self.fusable = (self.rotary_dim == self.head_dim and self.act == "silu" and not cfg.sandwich_norms
                        and self.window is None and self.sinks is None)

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
            qk = ops.head_norms(qk, self.heads, self.q_norm, self.k_norm, self.eps)
        if self.rotary_dim < d:   # partial rotary: the leading dims of each head turn, the rest pass
            r = self.rotary_dim
            qk = torch.cat([ops.rope(qk[..., :r].contiguous(), rope_state), qk[..., r:]], dim=-1)
        else:
            qk = ops.rope(qk, rope_state)
        q = qk[:, : self.heads] if self.q_scale is None else qk[:, : self.heads] * self.q_scale
        o = attn.forward(self.index, q, qk[:, self.heads:], v, batch, window=self.window, sinks=self.sinks)
        o = self.o(o.reshape(t, self.q_size))
        if self.attn_out_norm is not None:
            o = F.rms_norm(o.float(), (o.shape[-1],), self.attn_out_norm, self.eps).to(self.dtype)
        x, h = ops.add_rms_norm(x, o, self.post_attn_norm, self.eps, self.dtype)
        if self.moe is not None:
            return x, self.moe(h)
        gate_up = self.gate_up(h)
        y = self.down(ops.silu_mul(gate_up) if self.act == "silu" else ops.gelu_mul(gate_up))
        if self.mlp_out_norm is not None:
            y = F.rms_norm(y.float(), (y.shape[-1],), self.mlp_out_norm, self.eps).to(self.dtype)
        return x, y


def _sparse_moe(cfg: ModelConfig, w: dict, p: str, linear, platform: Platform, dtype: torch.dtype) -> SparseMoE:
    """Layer `p`'s experts under Mixtral's names (block_sparse_moe, w1 / w3 / w2), Qwen3-MoE's, or
    gpt-oss's (every expert in one tensor, gate and up interleaved, with biases)."""
    if p + "mlp.router.weight" in w:
        return _gpt_oss_moe(cfg, w, p + "mlp.", platform, dtype)
    if p + "block_sparse_moe.gate.weight" in w:
        m, names = p + "block_sparse_moe.", ("w1", "w3", "w2")
    else:
        m, names = p + "mlp.", ("gate_proj", "up_proj", "down_proj")
    gate, up, down = names
    experts = [(linear([f"{m}experts.{e}.{gate}", f"{m}experts.{e}.{up}"]), linear([f"{m}experts.{e}.{down}"]))
               for e in range(cfg.num_experts)]
    router = w[m + "gate.weight"].to(platform.device, torch.float32)
    return SparseMoE(router, experts, cfg.experts_per_token, cfg.norm_topk_prob, SWIGLU,
                     grouped=platform.grouped_experts(experts, SWIGLU))


def _gpt_oss_moe(cfg: ModelConfig, w: dict, m: str, platform: Platform, dtype: torch.dtype) -> SparseMoE:
    if m + "experts.gate_up_proj" in w:
        # [experts, hidden, 2 * inter] with gate and up interleaved: each expert's [gate | up] rows
        gate_up, gate_up_b = w[m + "experts.gate_up_proj"], w[m + "experts.gate_up_proj_bias"]
        down, down_b = w[m + "experts.down_proj"], w[m + "experts.down_proj_bias"]
        halves = lambda t: torch.cat([t[..., 0::2], t[..., 1::2]], dim=-1)  # noqa: E731
        experts = [(platform.linear([halves(gate_up[e]).t().contiguous()], halves(gate_up_b[e]), dtype),
                    platform.linear([down[e].t().contiguous()], down_b[e], dtype)) for e in range(cfg.num_experts)]
    else:   # a GGUF's: each expert's gate, up and down matrices with their biases
        x = lambda e, n: f"{m}experts.{e}.{n}_proj."  # noqa: E731
        experts = [(platform.linear([w[x(e, "gate") + "weight"], w[x(e, "up") + "weight"]],
                                    torch.cat([w[x(e, "gate") + "bias"], w[x(e, "up") + "bias"]]), dtype),
                    platform.linear([w[x(e, "down") + "weight"]], w[x(e, "down") + "bias"], dtype))
                   for e in range(cfg.num_experts)]
    router = w[m + "router.weight"].to(platform.device, torch.float32)
    bias = w[m + "router.bias"].to(platform.device, torch.float32)
    act = clamped_swiglu(cfg.swiglu_limit, cfg.swiglu_alpha)
    return SparseMoE(router, experts, cfg.experts_per_token, True, act, router_bias=bias, softmax_after_topk=True,
                     grouped=platform.grouped_experts(experts, act))


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
        self.norm = (weights["model.norm.weight"].float() + cfg.norm_weight_offset).to(device, torch.float32)
        # Gemma scales embeddings by sqrt(hidden) rounded to the model's dtype, as it was trained
        self.embed_scale = float(torch.tensor(cfg.embed_scale, dtype=dtype))
        head = ("model.embed_tokens.weight" if cfg.tie_word_embeddings or "lm_head.weight" not in weights
                else "lm_head.weight")
        self.lm_head = platform.linear([weights[head]], None, dtype)
        self.cos, self.sin = cos_sin_table(cfg.rotary_dim, cfg.rope_theta, cfg.rope_scaling,
                                           cfg.max_context_len, dtype, device)
        # the local (sliding-window) layers' own RoPE base (Gemma 3), unscaled
        self.local_cos_sin = None
        if cfg.local_rope_theta is not None:
            self.local_cos_sin = cos_sin_table(cfg.rotary_dim, cfg.local_rope_theta, None, cfg.max_context_len,
                                               dtype, device)
        # nothing between the ends and the layers (scaled embeddings, soft-capped logits): a decode
        # step may run whole in one call
        ends = ((self.embed, self.norm, cfg.rms_norm_eps, self.lm_head)
                if self.embed_scale == 1.0 and cfg.final_logit_softcap is None else None)
        self.fused_decode = self.ops.fused_decode(self.layers, self.cos, self.sin, ends)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, attn) -> torch.Tensor:
        """Float32 logits of `batch.sample_rows` (all rows when None)."""
        if self.fused_decode is not None and batch.paged_decode is not None and batch.sample_rows is None:
            logits = self.fused_decode.logits(batch.input_ids, batch.positions, batch.out_slots, batch.paged_decode)
            if logits is not None:
                return logits
        x = self.embed(batch.input_ids)
        if self.embed_scale != 1.0:
            x = x * self.embed_scale
        fused = None
        if self.fused_decode is not None and batch.paged_decode is not None:
            fused = self.fused_decode(x, batch.positions, batch.out_slots, batch.paged_decode)
        if fused is not None:
            x, delta = fused
        else:
            rope_state = self.ops.rope_positions(self.cos, self.sin, batch.positions)
            local = None if self.local_cos_sin is None else self.ops.rope_positions(*self.local_cos_sin, batch.positions)
            delta = None
            for layer in self.layers:
                x, delta = layer(x, delta, local if layer.local_rope else rope_state, batch, attn)
        if batch.sample_rows is not None:
            x, delta = x[batch.sample_rows], delta[batch.sample_rows]
        _, h = self.ops.add_rms_norm(x, delta, self.norm, self.cfg.rms_norm_eps, self.dtype)
        logits = self.lm_head(h).float()
        cap = self.cfg.final_logit_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap
