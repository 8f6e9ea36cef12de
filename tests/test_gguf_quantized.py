"""The block-quantized forms kept from a GGUF file's Q4_1 / Q8_0 weights are the same weights as
the dequantised ones, and the CPU runs small batches on them."""
import numpy as np
import torch

from radixserve.runtime.models.loader import Int4Weight, Int8Weight
from radixserve.runtime.platform import get_platform

LAYER = "model.layers.3.mlp.gate_proj.weight"
EMBED = "model.embed_tokens.weight"


def test_int4_form_reconstructs_dequantised_weights(default_model_files):
    files = default_model_files
    for name in ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
                 "model.layers.29.mlp.down_proj.weight"]:
        w4 = files.quantized[name]
        assert isinstance(w4, Int4Weight)
        rebuilt = (w4.q.astype(np.float32) - 8) * np.repeat(w4.scale, w4.group, 1) + np.repeat(w4.zero, w4.group, 1)
        np.testing.assert_allclose(rebuilt, files.weights[name].numpy(), atol=1e-6)


def test_int8_form_of_the_q8_0_embedding_reconstructs_it(default_model_files):
    w8 = default_model_files.quantized[EMBED]
    assert isinstance(w8, Int8Weight) and w8.q.dtype == np.int8
    rebuilt = w8.q.astype(np.float32) * np.repeat(w8.scale, 32, 1)
    np.testing.assert_array_equal(rebuilt, default_model_files.weights[EMBED].numpy())


def test_a_bf16_model_runs_small_batches_on_torchs_int4_kernel(default_model_files):
    files = default_model_files
    w = files.weights[LAYER].bfloat16()
    lin = get_platform(torch.device("cpu")).linear(w, quantized_parts=[files.quantized[LAYER]])
    assert lin.int4 is not None
    x = torch.randn(2, w.shape[1], generator=torch.Generator().manual_seed(0)).bfloat16()
    ref = x.float() @ files.weights[LAYER].t()
    # both sides round to bf16 (weights or scales, and the output): about 2^-8 of the output scale
    for y in (lin(x).float(), torch.nn.functional.linear(x, w).float()):
        assert (y - ref).abs().max() / ref.abs().max() < 0.02


def test_a_float32_model_runs_small_batches_on_the_block_kernels_with_float32_activations(default_model_files):
    files = default_model_files
    for name in (LAYER, EMBED):
        lin = get_platform(torch.device("cpu")).linear(files.weights[name], quantized_parts=[files.quantized[name]])
        assert lin.blocks is not None
        x = torch.randn(3, lin.weight.shape[1], generator=torch.Generator().manual_seed(0))
        y, ref = lin(x), x.double() @ files.weights[name].double().t()
        assert y.dtype == torch.float32
        # activations rounded to int16 per block: ~2^-16 of the block's largest, far below bf16's 2^-9
        assert (y - ref).abs().max() / ref.abs().max() < 1e-4


def test_large_batches_run_on_the_dequantised_weights(default_model_files):
    files = default_model_files
    lin = get_platform(torch.device("cpu")).linear(files.weights[LAYER], quantized_parts=[files.quantized[LAYER]])
    x = torch.randn(64, lin.weight.shape[1], generator=torch.Generator().manual_seed(0))
    assert torch.equal(lin(x), torch.nn.functional.linear(x, lin.weight))


def test_float32_asked_for_by_name_keeps_the_dequantised_weights_everywhere(make_engine):
    exact = make_engine(dtype="float32", kv_cache_tokens=1024)
    linears = lambda m: [m.lm_head] + [lin for la in m.layers for lin in (la.qkv, la.o, la.gate_up, la.down)]  # noqa: E731
    assert not any(lin.quantized for lin in linears(exact.model))
    default = make_engine(dtype="auto", kv_cache_tokens=1024)
    assert all(lin.quantized for lin in linears(default.model))
