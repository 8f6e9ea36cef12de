"""The GGUF reader (runtime/models/gguf_file.py) against the `gguf` package's own reader and
dequantiser, on the default model's file: the same metadata, tensors and float32 weights; and the
map's pages moved to huge pages (runtime/models/weight_memory.py) with every byte where it was."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGUFReader
from gguf.quants import dequantize as gguf_dequantize

from radixserve.kernels.cpu_kernels import load
from radixserve.runtime.config import EngineConfig
from radixserve.runtime.engine import Engine
from radixserve.runtime.models.gguf_file import GGUFFormatError, read_gguf
from radixserve.runtime.models.gguf_loader import dense
from radixserve.runtime.models.loader import default_model_path, load_model_files
from radixserve.runtime.models.quant import BlockTensor
from radixserve.runtime.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def both():
    path = default_model_path()
    reference = GGUFReader(str(path))
    return reference, read_gguf(path)


def mapping_of(array: np.ndarray) -> tuple[str, int]:
    """The path of the mapping (from /proc/self/smaps) that holds the array's first byte ("" for
    anonymous memory), and its AnonHugePages in kB."""
    address, found = array.ctypes.data, None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if "-" in head[0] and len(head) >= 5 and ":" not in head[0]:   # a mapping's first line
            lo, hi = (int(v, 16) for v in head[0].split("-"))
            if found is not None:
                break
            if lo <= address < hi:
                found = [head[5] if len(head) > 5 else "", 0]
        elif found is not None and head[0] == "AnonHugePages:":
            found[1] = int(head[1])
    assert found is not None, "no mapping holds the array"
    return found[0], found[1]


def transparent_huge_pages() -> bool:
    """Whether the kernel gives huge pages to memory that asks for them ('always' or 'madvise')."""
    try:
        return "[never]" not in Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False


def test_mapped_tensors_are_the_files_own_pages():
    _, tensors = read_gguf(default_model_path())
    path, _ = mapping_of(next(t for t in tensors.values() if t.tensor_type.name == "Q4_1").data)
    assert Path(path) == default_model_path().resolve()


def test_moving_the_map_to_huge_pages_keeps_every_byte_at_its_address():
    files = load_model_files(None)
    weights = {name: w.data for name, w in files.weights.items() if isinstance(w, BlockTensor)}
    before = {name: (data.ctypes.data, data.copy()) for name, data in weights.items()}
    assert files.mapped.to_huge_pages() and files.mapped.to_huge_pages()   # the second: a no-op
    for name, data in weights.items():
        assert data.ctypes.data == before[name][0] and np.array_equal(data, before[name][1]), name
    biggest = max(weights.values(), key=lambda d: d.nbytes)
    path, huge_kb = mapping_of(biggest[biggest.shape[0] // 2:])   # its middle lies in a moved 2 MiB page
    assert path == ""   # anonymous memory now, not the file's page cache
    if transparent_huge_pages():
        assert huge_kb * 1024 >= biggest.nbytes // 2


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


@pytest.mark.parametrize("mmap", [False, True])
def test_a_cpu_engine_moves_its_weights_to_huge_pages_unless_told_to_keep_the_map(mmap):
    engine = Engine(EngineConfig(device="cpu", kv_cache_tokens=256, mmap=mmap))
    try:
        assert (engine.weight_pages is None) == mmap
        if engine.weight_pages is not None:
            engine.weight_pages.join()
        data = engine.model.layers[0].gate_up.parts[0].data
        path, _ = mapping_of(data[data.shape[0] // 2:])
        assert (Path(path) == default_model_path().resolve()) if mmap else path == ""
    finally:
        engine.shutdown()


def test_greedy_replies_are_the_same_from_the_map_and_from_huge_pages():
    replies = []
    for mmap in (True, False):
        engine = Engine(EngineConfig(device="cpu", kv_cache_tokens=256, mmap=mmap))
        try:
            if engine.weight_pages is not None:
                engine.weight_pages.join()
            replies.append(engine.generate(["The capital of France is", "def fibonacci(n):"],
                                           SamplingParams(max_tokens=16, temperature=0.0)))
        finally:
            engine.shutdown()
    assert [r.token_ids for r in replies[0]] == [r.token_ids for r in replies[1]]
