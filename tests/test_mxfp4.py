"""gpt-oss's MXFP4 expert weights: dequantised per block exactly as the OCP format defines them, and
a checkpoint holding them loads the same weights as its dense twin."""
from __future__ import annotations

import json
import shutil

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from radixserve.runtime.models.loader import load_model_files
from radixserve.runtime.models.quant import mxfp4_dequantize
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


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), groups=st.integers(1, 4))
def test_blocks_dequantise_to_the_formats_own_values(seed, groups):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (3, 32 * groups), generator=g)
    exponents = torch.randint(0, 255, (3, groups), generator=g)   # every finite e8m0 exponent (255 is NaN)
    expected = torch.tensor([[e2m1(int(c)) * 2.0 ** (int(exponents[r, i // 32]) - 127) for i, c in enumerate(row)]
                             for r, row in enumerate(codes)], dtype=torch.float32)
    got = mxfp4_dequantize(pack(codes), exponents.to(torch.uint8))
    assert torch.equal(got, expected)


def test_an_mxfp4_checkpoint_loads_the_weights_of_its_dense_twin(tmp_path, default_tokenizer):
    """The tiny gpt-oss with MXFP4-representable experts, saved dense and as blocks + scales."""
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
    assert dense.keys() == mx.keys()
    assert all(torch.equal(dense[k], mx[k]) for k in dense)
