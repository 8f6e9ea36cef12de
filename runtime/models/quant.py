"""Block-quantized weights as a GGUF file stores them: the file's bytes, never a float copy.

A `BlockTensor` is a view of the file's memory map (rows of blocks, each row `row_bytes` long) and,
where the model needs its rows in another order (llama.cpp permutes q and k for its RoPE), a row
map instead of a reordered copy. The CPU's block kernels (kernels/cpu_kernels.cpp) read it as it
is; a device without them gets the dequantised matrix (`dequantize`), once, on its own terms.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

# The block types the kernels read, numbered as kernels/cpu_kernels.cpp's BlockKind:
# name -> (number, weights a block, bytes a block)
KINDS = {"Q4_0": (0, 32, 18), "Q4_1": (1, 32, 20), "Q8_0": (2, 32, 34),
         "Q4_K": (3, 256, 144), "Q5_K": (4, 256, 176), "Q6_K": (5, 256, 210), "MXFP4": (6, 32, 17)}


@dataclass(frozen=True)
class BlockTensor:
    """A [rows, cols] matrix of `kind` blocks; output row i is `data[row_map[i]]` (row i without a map)."""
    kind: str
    data: np.ndarray                       # uint8 [file rows, row bytes]
    cols: int
    row_map: Optional[np.ndarray] = None   # int32 [rows]

    def __post_init__(self):
        _, per_block, block_bytes = KINDS[self.kind]
        if self.cols % per_block or self.data.dtype != np.uint8 or self.data.ndim != 2 \
                or self.data.shape[1] != self.cols // per_block * block_bytes:
            raise ValueError(f"{self.kind} rows of {self.cols} values are not {self.data.shape[-1]} bytes")

    @property
    def rows(self) -> int:
        return len(self.row_map) if self.row_map is not None else self.data.shape[0]

    @property
    def kind_id(self) -> int:
        return KINDS[self.kind][0]

    # where row_map is a permutation of the file's rows: the output row of each file row, so that
    # one-token steps read the file's rows in order and write each result where it belongs (the
    # map's order, every other row of a head for q and k, took ~2x the time on a Zen 4 EPYC)
    out_of: Optional[np.ndarray] = None    # int32 [file rows]

    def reordered(self, order: np.ndarray) -> "BlockTensor":
        """Row i of the result is row order[i] of this one (no bytes move)."""
        rows = np.asarray(order) if self.row_map is None else self.row_map[np.asarray(order)]
        rows = np.ascontiguousarray(rows, dtype=np.int32)
        out_of = None
        if len(rows) == self.data.shape[0] and np.array_equal(np.sort(rows), np.arange(len(rows))):
            out_of = np.empty_like(rows)
            out_of[rows] = np.arange(len(rows), dtype=np.int32)
        return BlockTensor(self.kind, self.data, self.cols, rows, out_of)

    def dequantize(self) -> np.ndarray:
        """float32 [rows, cols], by the gguf package's own reference (what the kernels must equal)."""
        from gguf.constants import GGMLQuantizationType
        from gguf.quants import dequantize

        data = self.data if self.row_map is None else self.data[self.row_map]
        return np.asarray(dequantize(data, GGMLQuantizationType[self.kind]), dtype=np.float32).reshape(self.rows, self.cols)

    def dense(self) -> np.ndarray:
        """float32 [rows, cols], equal to `dequantize` bit for bit (tests/test_block_kernels.py), by
        the CPU kernels where they built: a model's dequantisation in a fraction of a second, not
        the reference's ~2 s for the 135M default model."""
        from radixserve.kernels import cpu_kernels
        kernels = cpu_kernels.load()
        if kernels is None:
            return self.dequantize()
        import torch
        return kernels.dequantize_rows(self, torch.arange(self.rows)).numpy()

    @property
    def nbytes(self) -> int:
        return self.data.nbytes


def is_block_kind(name: str) -> bool:
    return name in KINDS
