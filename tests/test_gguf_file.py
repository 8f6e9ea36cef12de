"""The GGUF reader (runtime/models/gguf_file.py) against the `gguf` package's own reader and
dequantiser, on the default model's file: the same metadata, tensors and float32 weights."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGUFReader
from gguf.quants import dequantize as gguf_dequantize

from radixserve.runtime.models.gguf_file import GGUFFormatError, read_gguf
from radixserve.kernels.cpu_kernels import load
from radixserve.runtime.models.gguf_loader import dense
from radixserve.runtime.models.loader import default_model_path
from radixserve.runtime.models.quant import BlockTensor


@pytest.fixture(scope="module")
def both():
    path = default_model_path()
    reference = GGUFReader(str(path))
    return reference, read_gguf(path)


def test_metadata_equals_the_gguf_packages(both):
    reference, (fields, _) = both
    for key, field in reference.fields.items():
        if key.startswith("GGUF."):  # the header, not metadata
            continue
        want = field.contents()
        assert fields[key] == pytest.approx(want) if isinstance(want, float) else fields[key] == want, key
    assert len(fields) == len([k for k in reference.fields if not k.startswith("GGUF.")])


def test_tensors_have_the_gguf_packages_names_shapes_types_and_bytes(both):
    reference, (_, tensors) = both
    assert list(tensors) == [t.name for t in reference.tensors]
    for t in reference.tensors:
        mine = tensors[t.name]
        assert mine.shape == tuple(int(d) for d in t.shape) and mine.tensor_type == t.tensor_type
        assert np.array_equal(mine.data.reshape(-1).view(np.uint8), np.asarray(t.data).reshape(-1).view(np.uint8))


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0", "F32"])
def test_dequantised_weights_equal_the_gguf_packages(both, kind):
    reference, (_, tensors) = both
    t = next(t for t in reference.tensors if t.tensor_type.name == kind)
    want = np.asarray(gguf_dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(-1)
    mine = tensors[t.name]
    if kind == "F32":
        got = dense(mine)
    else:   # as the engine reads them: the block kernels' dequantisation of the file's bytes
        blocks = BlockTensor(kind, mine.data, int(mine.shape[0]))
        got = load().dequantize_rows(blocks, torch.arange(blocks.rows)).numpy()
    assert np.array_equal(got.reshape(-1), want)


def test_a_file_that_is_not_gguf_is_refused(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"NOPE" + bytes(64))
    with pytest.raises(GGUFFormatError):
        read_gguf(bad)


def test_a_truncated_file_is_refused(tmp_path):
    data = default_model_path().read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(GGUFFormatError, match="past the end"):
        read_gguf(cut)
