"""The 4-bit form kept from Q4 GGUF weights is the same weight as the dequantised one."""
import numpy as np
import torch

from radixserve.runtime.platform import get_platform


def test_int4_form_reconstructs_dequantised_weights(default_model_files):
    files = default_model_files
    assert files.int4, "the default model's Q4_1 weights should keep their 4-bit form"
    for name in ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
                 "model.layers.29.mlp.down_proj.weight"]:
        w4 = files.int4[name]
        rebuilt = (w4.q.astype(np.float32) - 8) * np.repeat(w4.scale, w4.group, 1) + np.repeat(w4.zero, w4.group, 1)
        np.testing.assert_allclose(rebuilt, files.weights[name].numpy(), atol=1e-6)


def test_int4_matmul_matches_bf16_matmul_on_real_weights(default_model_files):
    files = default_model_files
    name = "model.layers.3.mlp.gate_proj.weight"
    w = files.weights[name].bfloat16()
    lin = get_platform(torch.device("cpu")).linear(w, int4_parts=[files.int4[name]])
    assert lin.int4 is not None
    x = torch.randn(2, w.shape[1], generator=torch.Generator().manual_seed(0)).bfloat16()
    ref = x.float() @ files.weights[name].t()
    # both sides round to bf16 (weights or scales, and the output): about 2^-8 of the output scale
    for y in (lin(x).float(), torch.nn.functional.linear(x, w).float()):
        assert (y - ref).abs().max() / ref.abs().max() < 0.02


def test_a_float32_model_runs_small_batches_on_the_int4_form_with_bf16_activations(default_model_files):
    files = default_model_files
    name = "model.layers.3.mlp.gate_proj.weight"
    lin = get_platform(torch.device("cpu")).linear(files.weights[name], int4_parts=[files.int4[name]])
    assert lin.int4 is not None
    x = torch.randn(2, lin.weight.shape[1], generator=torch.Generator().manual_seed(0))
    y, ref = lin(x), x @ files.weights[name].t()
    assert y.dtype == torch.float32
    assert (y - ref).abs().max() / ref.abs().max() < 0.02


def test_float32_asked_for_by_name_keeps_the_dequantised_weights_everywhere(make_engine):
    exact = make_engine(dtype="float32", kv_cache_tokens=1024)
    assert all(layer.qkv.int4 is None and layer.down.int4 is None for layer in exact.model.layers)
    default = make_engine(dtype="auto", kv_cache_tokens=1024)
    assert all(layer.qkv.int4 is not None and layer.down.int4 is not None for layer in default.model.layers)
