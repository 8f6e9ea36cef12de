"""gpt-oss's MXFP4 expert weights: repacked into GGUF's MXFP4 blocks (the block kernels' type) that
read back exactly as the OCP format defines them, and a checkpoint holding them loads the weights of
its dense twin."""
from __future__ import annotations

import json
import shutil

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from radixserve.runtime.models.loader import _mxfp4_experts, load_model_files
from radixserve.runtime.models.quant import BlockTensor
from .tiny_models import build_tiny_model


def e2m1(code: int) -> float:
    """The format's definition: sign, two exponent bits (bias 1), one mantissa bit; exponent 0 is subnormal."""
    sign = -1.0 if code & 8 else 1.0
    exponent, mantissa = (code >> 1) & 3, code & 1
    return sign * (mantissa * 0.5 if exponent == 0 else 2.0 ** (exponent - 1) * (1 + mantissa / 2))


def pack(codes: torch.Tensor) -> torch.Tensor:
    """[..., 32 * G] codes -> [..., G, 16] bytes, the first of each pair in the low nibble."""
    pairs = codes.view(*codes.shape[:-1], -1, 16, 2)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).to(torch.uint8)


def experts_of(codes: torch.Tensor, exponents: torch.Tensor, kind: str = "down_proj") -> dict:
    """A checkpoint's MXFP4 tensors of one layer's `kind` from codes [experts, out, 32 * G] and
    exponents [experts, out, G], loaded as the loader loads them."""
    experts, out = codes.shape[:2]
    base = f"model.layers.0.mlp.experts.{kind}"
    return _mxfp4_experts({base + "_blocks": pack(codes), base + "_scales": exponents.to(torch.uint8),
                           base + "_bias": torch.arange(experts * out, dtype=torch.float32).view(experts, out)})


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), groups=st.integers(1, 4))
def test_repacked_blocks_dequantise_to_the_formats_own_values(seed, groups):
    """The repacked blocks read back, by the gguf package's reference and by the kernels, as the OCP
    definition gives them: every code, every finite exponent (255 is NaN)."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (2, 3, 32 * groups), generator=g)
    exponents = torch.randint(0, 255, (2, 3, groups), generator=g)
    weights = experts_of(codes, exponents)
    for e in range(2):
        expected = torch.tensor([[e2m1(int(c)) * 2.0 ** (int(exponents[e, r, i // 32]) - 127) for i, c in enumerate(row)]
                                 for r, row in enumerate(codes[e])], dtype=torch.float32)
        t = weights[f"model.layers.0.mlp.experts.{e}.down_proj.weight"]
        assert isinstance(t, BlockTensor) and t.kind == "MXFP4"
        assert torch.equal(torch.from_numpy(t.dequantize()), expected)
        assert torch.equal(torch.from_numpy(t.dense()), expected)


def test_a_fused_gate_up_splits_into_its_interleaved_rows_with_their_biases():
    codes = torch.randint(0, 16, (1, 4, 32), generator=torch.Generator().manual_seed(0))
    weights = experts_of(codes, torch.full((1, 4, 1), 127), "gate_up_proj")
    whole = experts_of(codes, torch.full((1, 4, 1), 127))["model.layers.0.mlp.experts.0.down_proj.weight"].dequantize()
    p = "model.layers.0.mlp.experts.0."
    assert (weights[p + "gate_proj.weight"].dequantize() == whole[0::2]).all()
    assert (weights[p + "up_proj.weight"].dequantize() == whole[1::2]).all()
    assert weights[p + "gate_proj.bias"].tolist() == [0.0, 2.0] and weights[p + "up_proj.bias"].tolist() == [1.0, 3.0]


def test_an_mxfp4_checkpoint_loads_the_weights_of_its_dense_twin(tmp_path, default_tokenizer):
    """The tiny gpt-oss with MXFP4-representable experts, saved dense and as blocks + scales: the
    blocks are each expert's gate, up and down, and dequantise to the dense twin's."""
    dense_dir, packed_dir = tmp_path / "dense", tmp_path / "mxfp4"
    build_tiny_model("gpt_oss", dense_dir, default_tokenizer)
    weights = load_file(dense_dir / "model.safetensors")
    g = torch.Generator().manual_seed(1)
    lut = torch.tensor([e2m1(c) for c in range(16)])
    packed = {}
    for name in [k for k in weights if k.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        experts, inputs, outputs = weights[name].shape
        codes = torch.randint(0, 16, (experts, outputs, inputs), generator=g)
        exponents = torch.randint(120, 128, (experts, outputs, inputs // 32), generator=g)
        values = lut[codes] * torch.pow(2.0, exponents.float() - 127).repeat_interleave(32, dim=-1)
        weights[name] = values.transpose(1, 2).contiguous()           # the dense layout: [experts, in, out]
        packed[name + "_blocks"] = pack(codes)
        packed[name + "_scales"] = exponents.to(torch.uint8)
    save_file(weights, dense_dir / "model.safetensors")
    shutil.copytree(dense_dir, packed_dir)
    save_file({**{k: v for k, v in weights.items() if k + "_blocks" not in packed}, **packed},
              packed_dir / "model.safetensors")
    assert json.loads((packed_dir / "config.json").read_text())["model_type"] == "gpt_oss"
    dense, mx = load_model_files(str(dense_dir)).weights, load_model_files(str(packed_dir)).weights
    fused = [k for k in dense if ".mlp.experts." in k]
    assert all(torch.equal(dense[k], mx[k]) for k in dense if k not in fused)
    for layer in range(2):
        p = f"model.layers.{layer}.mlp.experts."
        gate_up, down = dense[p + "gate_up_proj"], dense[p + "down_proj"]
        gate_up_b, down_b = dense[p + "gate_up_proj_bias"], dense[p + "down_proj_bias"]
        for e in range(gate_up.shape[0]):
            for part, want, bias in (("gate_proj", gate_up[e].t()[0::2], gate_up_b[e, 0::2]),
                                     ("up_proj", gate_up[e].t()[1::2], gate_up_b[e, 1::2]),
                                     ("down_proj", down[e].t(), down_b[e])):
                assert mx[f"{p}{e}.{part}.weight"].kind == "MXFP4"
                assert torch.equal(torch.from_numpy(mx[f"{p}{e}.{part}.weight"].dequantize()), want)
                assert torch.equal(mx[f"{p}{e}.{part}.bias"], bias)
