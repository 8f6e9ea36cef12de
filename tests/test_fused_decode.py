"""A pure-decode step of a float32 model on block-quantized weights runs each decoder layer as one
kernel call (runtime/models/fused_decode.py): its logits and K/V writes are exactly those of the
layer's separate calls, for any batch of decodes the attention backend plans."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.runtime.attention import make_attention_backend
from radixserve.runtime.forward_batch import BatchLayout, ForwardBatch
from radixserve.runtime.kv_cache import KVCache
from radixserve.runtime.models.config import ModelConfig
from radixserve.runtime.models.llama import LlamaForCausalLM
from radixserve.runtime.models.loader import Int4Weight, Int8Weight
from radixserve.runtime.models.random_init import random_weights
from radixserve.runtime.platform import get_platform

CPU = get_platform(torch.device("cpu"))
LINEARS = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
           "mlp.up_proj", "mlp.down_proj"]


def config(attention_bias: bool = False, qk_norm: bool = False) -> ModelConfig:
    return ModelConfig("qwen2" if attention_bias else "llama", hidden_size=64, num_layers=3, num_heads=4,
                       num_kv_heads=2, head_dim=16, intermediate_size=96, vocab_size=300, max_context_len=2048,
                       attention_bias=attention_bias, qk_norm=qk_norm)


def blocks_of(w: torch.Tensor, bits: int):
    """w in GGUF-like blocks of 32 (Q4_1 or Q8_0), and the dense weight those blocks stand for."""
    a = w.double().numpy().reshape(w.shape[0], -1, 32)
    if bits == 8:
        scale = (np.abs(a).max(-1) / 127).astype(np.float32)
        q = np.rint(a / scale[..., None]).astype(np.int8)
        return Int8Weight(q.reshape(w.shape), scale), q.astype(np.float32) * scale[..., None]
    lo, hi = a.min(-1), a.max(-1)
    scale = ((hi - lo) / 15).astype(np.float32)
    q = np.clip(np.rint((a - lo[..., None]) / scale[..., None]), 0, 15).astype(np.uint8)
    zero = (lo + 8 * scale).astype(np.float32)
    return Int4Weight(q.reshape(w.shape), scale, zero, 32), (q.astype(np.float32) - 8) * scale[..., None] + zero[..., None]


def quantized_model(cfg: ModelConfig, dtype=torch.float32) -> LlamaForCausalLM:
    """A random model whose linear layers are 4-bit blocks (the LM head 8-bit), as a GGUF file holds them."""
    weights, quantized = random_weights(cfg, std=0.1), {}
    for name in [f"model.layers.{i}.{lin}.weight" for i in range(cfg.num_layers) for lin in LINEARS] + [
            "lm_head.weight"]:
        quantized[name], dense = blocks_of(weights[name], 8 if name == "lm_head.weight" else 4)
        weights[name] = torch.from_numpy(dense.reshape(weights[name].shape)).float()
    return LlamaForCausalLM(cfg, weights, dtype, CPU, quantized)


class Step:
    """A KV cache of random past tokens, a page table, the CPU attention backend and a step's decodes."""

    def __init__(self, cfg: ModelConfig, page_size: int, contexts: list[int], shared_pages: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        need = [-(-n // page_size) for n in contexts]
        num_pages = shared_pages + sum(need) + 1
        self.kv = KVCache(cfg.num_layers, num_pages, page_size, cfg.num_kv_heads, cfg.head_dim, torch.float32, CPU.device)
        self.kv.k.normal_(generator=g)
        self.kv.v.normal_(generator=g)
        order = torch.randperm(num_pages, generator=g).tolist()
        prefix = [order.pop() for _ in range(shared_pages)]   # one cached prefix every row starts with
        rows = [prefix[:n] + [order.pop() for _ in range(n - min(n, shared_pages))] for n in need]
        width = max(need)
        self.table = torch.tensor([r + [self.kv.pad_page] * (width - len(r)) for r in rows])
        self.attn = make_attention_backend("cpu", self.kv, self.table, cfg.num_heads, CPU)
        self.layout = BatchLayout(page_size)
        for i, (pages, n) in enumerate(zip(rows, contexts)):
            self.layout.add_decode(int(torch.randint(cfg.vocab_size, (1,), generator=g)), n - 1, i, pages)

    def batch(self) -> ForwardBatch:
        meta = self.attn.prepare(self.layout)
        return ForwardBatch.of(self.layout, meta, CPU, self.attn.paged_decode(meta))

    def forget_new_tokens(self, batch: ForwardBatch) -> None:
        """Zero the K/V slots that the step writes."""
        for cache in (self.kv.k, self.kv.v):
            cache.view(cache.shape[0], -1, *cache.shape[3:])[:, batch.out_slots] = 0


def separate_forward(model: LlamaForCausalLM, step: Step) -> torch.Tensor:
    fused, model.fused_decode = model.fused_decode, None
    try:
        return model.forward(step.batch(), step.attn)
    finally:
        model.fused_decode = fused


@settings(max_examples=25, deadline=None)
@given(data=st.data(), page_size=st.sampled_from([1, 4, 16]), bias=st.booleans(), seed=st.integers(0, 2**16))
def test_a_fused_decode_step_equals_the_separate_layer_calls(data, page_size, bias, seed):
    """Any mix of decodes, some reading one cached prefix, short and split contexts, with or
    without q/k/v biases: the same logits bit for bit, and the same K/V written."""
    cfg = config(attention_bias=bias)
    model = quantized_model(cfg)
    contexts = data.draw(st.lists(st.integers(1, 700), min_size=1, max_size=6))
    shared = data.draw(st.integers(0, (min(contexts) - 1) // page_size)) if len(contexts) > 1 else 0
    step = Step(cfg, page_size, contexts, shared, seed)
    batch = step.batch()
    assert batch.paged_decode is not None
    fused = model.forward(batch, step.attn)
    k, v = step.kv.k.clone(), step.kv.v.clone()
    step.forget_new_tokens(batch)
    assert torch.equal(fused, separate_forward(model, step))
    assert torch.equal(step.kv.k, k) and torch.equal(step.kv.v, v)


def test_a_float32_model_on_block_weights_decodes_with_one_call_per_layer():
    assert quantized_model(config()).fused_decode is not None


@pytest.mark.parametrize("what", ["bfloat16", "dense weights", "q/k norms"])
def test_a_model_the_layer_kernel_does_not_cover_keeps_the_separate_calls(what):
    if what == "bfloat16":
        model = quantized_model(config(), dtype=torch.bfloat16)
    elif what == "dense weights":
        cfg = config()
        model = LlamaForCausalLM(cfg, random_weights(cfg), torch.float32, CPU)
    else:
        model = quantized_model(config(qk_norm=True))
    assert model.fused_decode is None


def test_a_step_with_a_prefill_runs_the_separate_calls():
    cfg = config()
    step = Step(cfg, 4, [40, 24], 0, seed=0)
    step.layout = BatchLayout(4)
    step.layout.add_decode(7, 39, 0, step.table[0].tolist())
    step.layout.add_extend(list(range(24)), 0, 24, 1, step.table[1].tolist(), samples=True)
    assert step.batch().paged_decode is None


def test_more_decodes_than_the_block_form_takes_run_the_separate_calls():
    cfg = config()
    model = quantized_model(cfg)
    step = Step(cfg, 16, [32] * (model.fused_decode.max_tokens + 1), 0, seed=0)
    batch = step.batch()
    x = torch.zeros(batch.num_tokens, cfg.hidden_size)
    assert model.fused_decode(x, batch.positions, batch.out_slots, batch.paged_decode) is None
