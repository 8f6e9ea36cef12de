"""A GGUF file's metadata and tensor views, read with `struct` over one memory map.

`gguf.GGUFReader` builds a numpy view per metadata item: for a 49k-token vocabulary and its merges
that took 9 s of the default model's 14 s load here, on every server start. This reader parses the
same format (v2 / v3) in well under a second; tensor data stays in the map until dequantised (on
the CPU the engine moves the map's pages to huge pages: runtime/models/weight_memory.py).
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from radixserve.runtime.models.weight_memory import MappedWeights

_MAGIC = b"GGUF"
_DEFAULT_ALIGNMENT = 32
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
# numpy dtypes of the unquantised tensor types (their data is typed, not bytes)
_PLAIN = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16,
          GGMLQuantizationType.F64: np.float64, GGMLQuantizationType.I8: np.int8,
          GGMLQuantizationType.I16: np.int16, GGMLQuantizationType.I32: np.int32,
          GGMLQuantizationType.I64: np.int64}


@dataclass
class GGUFTensor:
    name: str
    shape: tuple[int, ...]          # GGUF order: fastest-varying dimension first
    tensor_type: GGMLQuantizationType
    data: np.ndarray                # plain types: typed, rows x cols; quantised: uint8, rows x row bytes


class GGUFFormatError(ValueError):
    pass


class _Cursor:
    def __init__(self, buf: memoryview):
        self.buf, self.pos = buf, 0

    def unpack(self, fmt: str) -> Any:
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.unpack("<Q")
        start, self.pos = self.pos, self.pos + n
        return bytes(self.buf[start:self.pos]).decode("utf-8", errors="replace")

    def value(self, kind: int) -> Any:
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.unpack("<I"), self.unpack("<Q")
            if item in _SCALARS:  # one unpack for the whole run of numbers
                fmt = f"<{count}{_SCALARS[item][1]}"
                values = list(struct.unpack_from(fmt, self.buf, self.pos))
                self.pos += struct.calcsize(fmt)
                return values
            read: Callable[[], Any] = self.string if item == _STRING else (lambda: self.value(item))
            return [read() for _ in range(count)]
        if kind not in _SCALARS:
            raise GGUFFormatError(f"unknown metadata value type {kind}")
        return self.unpack(_SCALARS[kind])


def read_gguf(path: Path) -> tuple[dict[str, Any], dict[str, GGUFTensor]]:
    """Metadata as Python values, and the tensors (views into the file) by name."""
    fields, tensors, _ = read_gguf_mapped(path)
    return fields, tensors


def read_gguf_mapped(path: Path) -> tuple[dict[str, Any], dict[str, GGUFTensor], MappedWeights]:
    """As read_gguf, with the tensor data region of the map that every tensor is a view of."""
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    buf = memoryview(mapped)
    c = _Cursor(buf)
    if bytes(buf[:4]) != _MAGIC:
        raise GGUFFormatError("no GGUF magic number")
    c.pos = 4
    version = c.unpack("<I")
    if version not in (2, 3):
        raise GGUFFormatError(f"GGUF version {version} is not supported (2 or 3)")
    n_tensors, n_fields = c.unpack("<Q"), c.unpack("<Q")
    fields: dict[str, Any] = {}
    for _ in range(n_fields):
        key = c.string()
        fields[key] = c.value(c.unpack("<I"))
    infos = []
    for _ in range(n_tensors):
        name = c.string()
        shape = tuple(c.unpack("<Q") for _ in range(c.unpack("<I")))
        infos.append((name, shape, GGMLQuantizationType(c.unpack("<I")), c.unpack("<Q")))
    alignment = int(fields.get("general.alignment", _DEFAULT_ALIGNMENT))
    data_start = -(-c.pos // alignment) * alignment
    everything = np.frombuffer(mapped, dtype=np.uint8)
    region = MappedWeights(path, data_start, everything[data_start:])
    tensors = {}
    for name, shape, kind, offset in infos:
        cols = shape[0]
        rows = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        start = data_start + offset
        if kind in _PLAIN:
            dtype = np.dtype(_PLAIN[kind])
            nbytes, view = rows * cols * dtype.itemsize, dtype
        else:
            block, block_bytes = GGML_QUANT_SIZES[kind]
            nbytes, view = rows * cols // block * block_bytes, np.uint8
        if start + nbytes > everything.size:
            raise GGUFFormatError(f"tensor {name} runs past the end of the file")
        data = everything[start:start + nbytes].view(view)
        tensors[name] = GGUFTensor(name, shape, kind, data.reshape(rows, -1) if len(shape) > 1 else data)
    return fields, tensors, region
