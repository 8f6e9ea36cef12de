"""A MoE layer's dense experts as one C++ call on the CPU (runtime/models/moe.py: CpuExperts)
against a float64 reference, alone against batched, and against the per-expert loop."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from radixserve.kernels.cpu_kernels import load
from radixserve.runtime.models.linear import CpuLinear
from radixserve.runtime.models.moe import SWIGLU, CpuExperts, ExpertAct, SparseMoE, clamped_swiglu
from radixserve.runtime.platform import get_platform

KERNELS = load()
assert KERNELS is not None, "the CPU kernels did not build"
GPT_OSS = clamped_swiglu(7.0, 1.702)


def make_experts(n: int, hidden: int, inter: int, dtype: torch.dtype, biases: bool, seed: int) -> list[tuple]:
    gen = torch.Generator().manual_seed(seed)
    w = lambda *shape: (torch.randn(*shape, generator=gen) * 0.3).to(dtype)  # noqa: E731
    b = lambda size: torch.randn(size, generator=gen) if biases else None  # noqa: E731
    return [(CpuLinear(w(2 * inter, hidden), b(2 * inter)), CpuLinear(w(hidden, inter), b(hidden))) for _ in range(n)]


def reference(experts: list[tuple], act: ExpertAct, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor):
    """Each token's experts in float64, weighted and added."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            g, d = experts[int(ids[t, j])]
            bias = lambda layer: 0 if layer.bias is None else layer.bias.double()  # noqa: E731
            h = x[t].double() @ g.weight.double().t() + bias(g)
            y = act(h) @ d.weight.double().t() + bias(d)
            out[t] += float(weights[t, j]) * y
    return out


def routing(tokens: int, experts: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:k] for _ in range(tokens)])
    return ids, torch.rand(tokens, k, generator=gen)


@settings(max_examples=30, deadline=None)
@given(tokens=st.integers(1, 9), experts=st.integers(1, 6), hidden=st.sampled_from([4, 16, 24, 40]),
       inter=st.sampled_from([3, 8, 20]), dtype=st.sampled_from([torch.float32, torch.bfloat16]),
       gpt_oss=st.booleans(), seed=st.integers(0, 1000))
def test_cpu_experts_match_float64_experts(tokens, experts, hidden, inter, dtype, gpt_oss, seed):
    layers = make_experts(experts, hidden, inter, dtype, biases=gpt_oss, seed=seed)
    act = GPT_OSS if gpt_oss else SWIGLU
    ids, weights = routing(tokens, experts, min(experts, 3), seed)
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(seed + 1))
    got = CpuExperts.of(KERNELS, layers, act)(x, weights, ids, act)
    expected = reference(layers, act, x, ids, weights)
    assert torch.allclose(got.double(), expected, rtol=1e-4, atol=1e-4 * float(expected.abs().max()) + 1e-5)


@pytest.mark.parametrize("form", ["dense", "block"])
def test_a_tokens_output_is_the_same_alone_or_in_a_batch(form):
    layers = (make_experts(8, 64, 48, torch.float32, biases=False, seed=3) if form == "dense"
              else block_experts("Q8_0", 8, 128, 64, seed=22))
    hidden = 64 if form == "dense" else 128
    ids, weights = routing(11, 8, 2, seed=4)
    x = torch.randn(11, hidden, generator=torch.Generator().manual_seed(5))
    experts = CpuExperts.of(KERNELS, layers, SWIGLU)
    batched = experts(x, weights, ids, SWIGLU)
    alone = torch.cat([experts(x[t:t + 1], weights[t:t + 1], ids[t:t + 1], SWIGLU) for t in range(11)])
    assert torch.equal(batched, alone)


def test_a_tokens_experts_are_added_in_expert_order_whatever_the_router_order():
    layers = make_experts(5, 32, 16, torch.float32, biases=False, seed=6)
    ids, weights = routing(3, 5, 3, seed=7)
    x = torch.randn(3, 32, generator=torch.Generator().manual_seed(8))
    experts = CpuExperts.of(KERNELS, layers, SWIGLU)
    flipped = experts(x, weights.flip(1).contiguous(), ids.flip(1).contiguous(), SWIGLU)
    assert torch.equal(experts(x, weights, ids, SWIGLU), flipped)


def loop_and_fused(layers: list[tuple], hidden: int, act: ExpertAct) -> tuple[SparseMoE, SparseMoE]:
    """One MoE layer over `layers`: the per-expert loop, and as the CPU platform builds it."""
    router = torch.randn(len(layers), hidden, generator=torch.Generator().manual_seed(10))
    grouped = get_platform(torch.device("cpu")).grouped_experts(layers, act)
    fused = SparseMoE(router, layers, 2, True, act, grouped=grouped)
    assert isinstance(fused.grouped, CpuExperts)
    return SparseMoE(router, layers, 2, True, act), fused


@pytest.mark.parametrize("act", [SWIGLU, GPT_OSS], ids=["swiglu", "clamped"])
def test_moe_layer_on_cpu_experts_matches_its_per_expert_loop(act):
    loop, fused = loop_and_fused(make_experts(6, 48, 32, torch.float32, biases=act is GPT_OSS, seed=9), 48, act)
    h = torch.randn(5, 48, generator=torch.Generator().manual_seed(11))
    assert torch.allclose(fused(h), loop(h), rtol=1e-5, atol=1e-5)


def test_steps_longer_than_the_kernels_limit_take_the_per_expert_loop():
    layers = make_experts(4, 16, 8, torch.float32, biases=False, seed=12)
    router = torch.randn(4, 16, generator=torch.Generator().manual_seed(13))
    loop = SparseMoE(router, layers, 2, True, SWIGLU)
    fused = SparseMoE(router, layers, 2, True, SWIGLU, grouped=CpuExperts.of(KERNELS, layers, SWIGLU))
    h = torch.randn(CpuExperts.max_tokens + 1, 16, generator=torch.Generator().manual_seed(14))
    assert torch.equal(fused(h), loop(h))


def test_cpu_platform_leaves_experts_it_cannot_take_to_the_loop():
    platform = get_platform(torch.device("cpu"))
    mixed = make_experts(2, 16, 8, torch.float32, biases=False, seed=15) + \
        make_experts(1, 16, 8, torch.bfloat16, biases=False, seed=16)
    assert platform.grouped_experts(mixed, SWIGLU) is None
    transposed = [(CpuLinear(torch.randn(16, 16).t()), CpuLinear(torch.randn(16, 8))) for _ in range(2)]
    assert platform.grouped_experts(transposed, SWIGLU) is None
    assert platform.grouped_experts(make_experts(2, 16, 8, torch.float16, False, 17), SWIGLU) is None


def test_cpu_experts_refuse_an_expert_id_out_of_range():
    layers = make_experts(3, 16, 8, torch.float32, biases=False, seed=18)
    experts = CpuExperts.of(KERNELS, layers, SWIGLU)
    with pytest.raises(IndexError):
        experts(torch.randn(1, 16), torch.ones(1, 1), torch.tensor([[3]]), SWIGLU)


@pytest.mark.parametrize("arch", ["mixtral", "qwen3_moe", "gpt_oss"])
def test_moe_families_run_their_dense_experts_as_one_cpu_call(arch, make_engine, tmp_path, default_tokenizer):
    from radixserve.runtime.models.loader import load_model_files
    from .tiny_models import build_tiny_model
    build_tiny_model(arch, tmp_path / arch, default_tokenizer)
    engine = make_engine(load_model_files(str(tmp_path / arch)), kv_cache_tokens=256)
    moes = [layer.moe for layer in engine.model.layers if layer.moe is not None]
    assert moes and all(isinstance(moe.grouped, CpuExperts) for moe in moes)


# ---- block-quantized experts (a GGUF's stacked expert tensors) ----------------------------------
def block_experts(kind: str, n: int, hidden: int, inter: int, seed: int) -> list[tuple]:
    import numpy as np
    from radixserve.runtime.models.linear import BlockLinear
    from radixserve.runtime.models.quant import BlockTensor
    from .kquants import random_blocks
    rng = np.random.default_rng(seed)
    t = lambda rows, cols: BlockTensor(kind, random_blocks(kind, rows, cols, rng, scale=0.05), cols)  # noqa: E731
    return [(BlockLinear([t(inter, hidden), t(inter, hidden)], None, KERNELS),
             BlockLinear([t(hidden, inter)], None, KERNELS)) for _ in range(n)]


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_1", "Q4_K"])
def test_block_experts_match_their_per_expert_loop(kind):
    loop, fused = loop_and_fused(block_experts(kind, 6, 256, 256, seed=19), 256, SWIGLU)
    h = torch.randn(9, 256, generator=torch.Generator().manual_seed(21))
    expected = loop(h)
    # the two compute silu in different float steps, and the down projection rounds its input to
    # int8 blocks: a value on a rounding boundary may land one step apart
    torch.testing.assert_close(fused(h), expected, rtol=0, atol=2e-3 * float(expected.abs().max()))
