"""A pure-decode step of a float32 model on block-quantized weights runs each decoder layer as one
kernel call (runtime/models/fused_decode.py): its logits and K/V writes are exactly those of the
layer's separate calls, for any batch of decodes the attention backend plans."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.runtime.attention import make_attention_backend
from radixserve.runtime.forward_batch import BatchLayout, ForwardBatch
from radixserve.runtime.kv_cache import KVCache
from radixserve.runtime.models.config import ModelConfig
from radixserve.runtime.models.llama import LlamaForCausalLM
from radixserve.runtime.models.random_init import random_weights
from radixserve.runtime.platform import get_platform

from .kquants import quantized

CPU = get_platform(torch.device("cpu"))
LINEARS = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
           "mlp.up_proj", "mlp.down_proj"]


def config(attention_bias: bool = False, qk_norm: bool = False, moe: bool = False, **more) -> ModelConfig:
    # widths of whole K-quant super-blocks (256), so that every block type can hold any matrix;
    # a MoE model's middle layer keeps a dense MLP, as some (dense_layers) do
    experts = dict(num_experts=4, experts_per_token=2, moe_intermediate_size=256, dense_layers=(1,)) if moe else {}
    return ModelConfig("qwen2" if attention_bias else "llama", hidden_size=256, num_layers=3, num_heads=4,
                       num_kv_heads=2, head_dim=64, intermediate_size=512, vocab_size=300, max_context_len=2048,
                       attention_bias=attention_bias, qk_norm=qk_norm, **experts, **more)


# the families the layer kernel covers: Llama, Qwen2 (q/k/v biases), Qwen3 (q/k norms), and a
# Qwen3-MoE (its layers' attention fused, their experts a call of their own)
FAMILIES = {"llama": {}, "qwen2": dict(attention_bias=True), "qwen3": dict(qk_norm=True),
            "qwen3_moe": dict(qk_norm=True, moe=True)}

# each layer's block types, as GGUF files mix them: legacy, Q4_K_M-like (v and down in Q6_K), Q5_K
KINDS_OF_LAYER = [
    {"self_attn.v_proj": "Q8_0", "mlp.down_proj": "Q4_0"},
    {"self_attn.v_proj": "Q6_K", "mlp.down_proj": "Q6_K", "default": "Q4_K"},
    {"self_attn.q_proj": "Q4_1", "default": "Q5_K"},
]


def quantized_model(cfg: ModelConfig, dtype=torch.float32, block_embedding: bool = False) -> LlamaForCausalLM:
    """A random model whose linear layers (and experts) are block-quantized (the LM head Q8_0), as a
    GGUF file holds them; `block_embedding`: the embedding table too (Q6_K, as Q4_K_M files have it)."""
    weights = random_weights(cfg, std=0.1)
    if block_embedding:
        weights["model.embed_tokens.weight"] = quantized("Q6_K", weights["model.embed_tokens.weight"].numpy())
    g = torch.Generator().manual_seed(1)
    for i in range(cfg.num_layers):
        kinds = KINDS_OF_LAYER[i % len(KINDS_OF_LAYER)]
        kind = lambda lin: kinds.get(lin, kinds.get("default", "Q4_1"))  # noqa: E731
        for lin in LINEARS:
            name = f"model.layers.{i}.{lin}.weight"
            weights[name] = quantized(kind(lin), weights[name].numpy())
        if cfg.is_moe_layer(i):
            m, inter = f"model.layers.{i}.mlp.", cfg.moe_intermediate_size
            weights[m + "gate.weight"] = torch.randn(cfg.num_experts, cfg.hidden_size, generator=g)
            for e in range(cfg.num_experts):
                for lin, shape in (("gate_proj", (inter, cfg.hidden_size)), ("up_proj", (inter, cfg.hidden_size)),
                                   ("down_proj", (cfg.hidden_size, inter))):
                    dense = torch.randn(*shape, generator=g) * 0.1
                    weights[f"{m}experts.{e}.{lin}.weight"] = quantized(kind("mlp." + lin), dense.numpy())
    weights["lm_head.weight"] = quantized("Q8_0", weights["lm_head.weight"].numpy())
    return LlamaForCausalLM(cfg, weights, dtype, CPU)


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
@given(data=st.data(), page_size=st.sampled_from([1, 4, 16]), family=st.sampled_from(sorted(FAMILIES)),
       block_embedding=st.booleans(), seed=st.integers(0, 2**16))
def test_a_fused_decode_step_equals_the_separate_layer_calls(data, page_size, family, block_embedding, seed):
    """Any mix of decodes, some reading one cached prefix, short and split contexts, in each family
    the kernel covers, with a dense or a block embedding: the same logits bit for bit, and the same
    K/V written."""
    cfg = config(**FAMILIES[family])
    model = quantized_model(cfg, block_embedding=block_embedding)
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


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_float32_model_on_block_weights_decodes_with_one_call_per_layer(family):
    assert quantized_model(config(**FAMILIES[family])).fused_decode is not None


@pytest.mark.parametrize("block_embedding", [False, True], ids=["dense embedding", "block embedding"])
def test_a_decode_step_of_a_model_without_moe_layers_runs_whole_in_one_call(block_embedding):
    model = quantized_model(config(), block_embedding=block_embedding)
    step = Step(model.cfg, 4, [40, 9], 0, seed=0)
    batch = step.batch()
    logits = model.fused_decode.logits(batch.input_ids, batch.positions, batch.out_slots, batch.paged_decode)
    assert logits is not None and logits.shape == (2, model.cfg.vocab_size)


def test_a_decode_step_with_rows_for_the_heads_gemm_keeps_the_heads_own_call():
    """From the rows where the LM head takes the platform's GEMM (which rounds its own way), the
    step is not run whole: its logits are those of the head's own call."""
    model = quantized_model(config(), block_embedding=True)
    model.lm_head.choose([("bf16", 4)])
    step = Step(model.cfg, 4, [9, 17, 30, 12, 5], 0, seed=3)
    batch = step.batch()
    assert model.fused_decode.logits(batch.input_ids, batch.positions, batch.out_slots, batch.paged_decode) is None
    step.forget_new_tokens(batch)
    fused = model.forward(step.batch(), step.attn)
    step.forget_new_tokens(batch)
    assert torch.equal(fused, separate_forward(model, step))


def test_a_moe_model_runs_its_experts_between_the_layer_calls_not_whole():
    model = quantized_model(config(**FAMILIES["qwen3_moe"]))
    batch = Step(model.cfg, 4, [12], 0, seed=0).batch()
    assert model.fused_decode.logits(batch.input_ids, batch.positions, batch.out_slots, batch.paged_decode) is None


def test_a_whole_decode_step_refuses_a_token_outside_the_embedding():
    model = quantized_model(config(), block_embedding=True)
    batch = Step(model.cfg, 4, [12], 0, seed=0).batch()
    batch.input_ids[0] = model.cfg.vocab_size
    with pytest.raises(IndexError):
        model.fused_decode.logits(batch.input_ids, batch.positions, batch.out_slots, batch.paged_decode)


@pytest.mark.parametrize("what", ["bfloat16", "dense weights", "partial rotary"])
def test_a_model_the_layer_kernel_does_not_cover_keeps_the_separate_calls(what):
    if what == "bfloat16":
        model = quantized_model(config(), dtype=torch.bfloat16)
    elif what == "dense weights":
        cfg = config()
        model = LlamaForCausalLM(cfg, random_weights(cfg), torch.float32, CPU)
    else:
        model = quantized_model(config(rotary_dim=32))
    assert model.fused_decode is None


def test_a_step_with_a_prefill_runs_the_separate_calls():
    cfg = config()
    step = Step(cfg, 4, [40, 24], 0, seed=0)
    step.layout = BatchLayout(4)
    step.layout.add_decode(7, 39, 0, step.table[0].tolist())
    step.layout.add_extend(list(range(24)), 0, 24, 1, step.table[1].tolist(), samples=True)
    assert step.batch().paged_decode is None


def test_a_step_of_many_decodes_runs_fused():
    """The block kernels take any batch: 40 decodes are still one call per layer."""
    cfg = config()
    model = quantized_model(cfg)
    step = Step(cfg, 16, [32] * 40, 0, seed=0)
    batch = step.batch()
    x = torch.zeros(batch.num_tokens, cfg.hidden_size)
    assert model.fused_decode(x, batch.positions, batch.out_slots, batch.paged_decode) is not None
