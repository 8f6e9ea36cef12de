"""A GGUF file's quantized matrices stay the file's bytes: views of one copy of them (huge-page
memory, or the file's map with `--mmap`: tests/test_gguf_file.py), run on the block kernels with no
float copy; only `--dtype float32`, the reference, dequantises them."""
import mmap

import numpy as np
import torch

from radixserve.runtime.models.linear import BlockEmbedding, BlockLinear
from radixserve.runtime.models.quant import BlockTensor
from radixserve.runtime.platform import get_platform

LAYER = "model.layers.3.mlp.gate_proj.weight"
EMBED = "model.embed_tokens.weight"
CPU = get_platform(torch.device("cpu"))


def root(a):
    while isinstance(a, np.ndarray) and a.base is not None:
        a = a.base
    return a.obj if isinstance(a, memoryview) else a


def test_quantized_matrices_are_views_of_one_copy_of_the_files_bytes(default_model_files):
    weights = [default_model_files.weights[name] for name in (LAYER, EMBED, "model.layers.0.self_attn.q_proj.weight")]
    assert all(isinstance(w, BlockTensor) for w in weights)
    roots = {id(root(w.data)) for w in weights}
    assert len(roots) == 1 and isinstance(root(weights[0].data), mmap.mmap)


def test_q_and_k_are_unpermuted_by_a_row_map_not_a_copy(default_model_files):
    w = default_model_files.weights["model.layers.0.self_attn.q_proj.weight"]
    assert w.row_map is not None and sorted(w.row_map.tolist()) == list(range(w.rows))


def test_a_quantized_linear_runs_on_the_blocks_with_no_dense_weight(default_model_files):
    w = default_model_files.weights[LAYER]
    lin = CPU.linear([w], None, torch.float32)
    assert isinstance(lin, BlockLinear) and lin.weight is None
    x = torch.randn(3, w.cols, generator=torch.Generator().manual_seed(0))
    y, ref = lin(x).double(), x.double() @ torch.from_numpy(w.dequantize()).double().t()
    # activations rounded to int8 per block of 32: about 2^-8 of the output scale
    assert (y - ref).abs().max() / ref.abs().max() < 0.02


def test_the_quantized_embedding_looks_up_exact_dequantised_rows(default_model_files):
    w = default_model_files.weights[EMBED]
    embed = CPU.embedding(w, torch.float32)
    assert isinstance(embed, BlockEmbedding)
    ids = torch.tensor([0, 17, w.rows - 1, 17])
    assert np.array_equal(embed(ids).numpy(), w.dequantize()[ids.numpy()])


def test_the_default_dtype_of_a_quantized_model_is_float32_activations():
    assert CPU.default_dtype(block_quantized=True) == torch.float32


def test_float32_asked_for_by_name_keeps_the_dequantised_weights_everywhere(make_engine):
    exact = make_engine(dtype="float32", kv_cache_tokens=1024)
    linears = lambda m: [m.lm_head] + [lin for la in m.layers for lin in (la.qkv, la.o, la.gate_up, la.down)]  # noqa: E731
    assert not any(lin.quantized for lin in linears(exact.model))
    default = make_engine(dtype="auto", kv_cache_tokens=1024)
    assert all(lin.quantized for lin in linears(default.model))
