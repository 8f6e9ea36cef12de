"""A small quantiser of our own for GGUF's block types (tests cannot depend on llama.cpp's
llama-quantize), and random blocks for the kernels' tests. K-quant layouts as gguf's reference
dequantises them; the legacy types through the gguf package's own quantiser."""
from __future__ import annotations

import numpy as np
from gguf.constants import GGMLQuantizationType
from gguf.quants import quantize as gguf_quantize

from radixserve.runtime.models.quant import KINDS, BlockTensor

# where each type keeps its f16 scales (bytes of a block)
SCALE_BYTES = {"Q4_0": [0], "Q4_1": [0, 2], "Q8_0": [0], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}
LEGACY = ("Q4_0", "Q4_1", "Q8_0", "MXFP4")   # blocks of 32 (the K-quants': super-blocks of 256)


def _f16(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16).view(np.uint8).reshape(*a.shape, 2)


def _pack_scales_k4(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """8 six-bit scales and mins per super-block -> the 12 bytes Q4_K / Q5_K store."""
    out = np.zeros((sc.shape[0], 12), np.uint8)
    out[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    out[:, 4:8] = m[:, :4] | ((m[:, 4:] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:] & 0xF) | ((m[:, 4:] & 0xF) << 4)
    return out


def _scaled(levels: int, sub: np.ndarray):
    """Asymmetric sub-blocks [n, 8, 32] -> f16 d, dmin, 6-bit scales and mins, q in 0..levels."""
    lo, hi = np.minimum(sub.min(-1), 0), sub.max(-1)
    scale, mins = (hi - lo) / levels, -lo
    d = (scale.max(-1) / 63).astype(np.float16).astype(np.float32)
    dmin = (mins.max(-1) / 63).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d[:, None] > 0, np.clip(np.rint(scale / d[:, None]), 0, 63), 0).astype(np.uint8)
        m = np.where(dmin[:, None] > 0, np.clip(np.rint(mins / dmin[:, None]), 0, 63), 0).astype(np.uint8)
        step = d[:, None] * sc
        q = np.where(step[..., None] > 0, np.rint((sub + (dmin[:, None] * m)[..., None]) / step[..., None]), 0)
    return d, dmin, sc, m, np.clip(q, 0, levels).astype(np.uint8)


def quantize_blocks(kind: str, x: np.ndarray) -> np.ndarray:
    """Rows x [rows, cols] (float32) -> uint8 [rows, row bytes] of `kind`."""
    rows, cols = x.shape
    if kind in LEGACY:
        return gguf_quantize(x.astype(np.float32), GGMLQuantizationType[kind])
    n = rows * cols // 256
    if kind in ("Q4_K", "Q5_K"):
        d, dmin, sc, m, q = _scaled(15 if kind == "Q4_K" else 31, x.reshape(n, 8, 32))
        low = (q & 0xF).reshape(n, 4, 2, 32)
        qs = (low[:, :, 0] | (low[:, :, 1] << 4)).reshape(n, 128)
        parts = [_f16(d), _f16(dmin), _pack_scales_k4(sc, m)]
        if kind == "Q5_K":
            parts.append(((q >> 4) << np.arange(8, dtype=np.uint8)[None, :, None]).sum(1, dtype=np.uint8))
        return np.concatenate(parts + [qs], axis=1).reshape(rows, -1)
    assert kind == "Q6_K"
    sub = x.reshape(n, 16, 16)
    scale = np.abs(sub).max(-1) / 31
    d = (scale.max(-1) / 127).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d[:, None] > 0, np.clip(np.rint(scale / d[:, None]), -128, 127), 0).astype(np.int8)
        step = (d[:, None] * sc)[..., None]
        u = (np.clip(np.where(step != 0, np.rint(sub / step), 0), -32, 31) + 32).astype(np.uint8)
    u = u.reshape(n, 2, 4, 32)   # half, k, l
    ql = np.concatenate([(u[:, :, 0] & 0xF) | ((u[:, :, 2] & 0xF) << 4),
                         (u[:, :, 1] & 0xF) | ((u[:, :, 3] & 0xF) << 4)], axis=2).reshape(n, 128)
    qh = sum(((u[:, :, k] >> 4) & 3) << (2 * k) for k in range(4)).astype(np.uint8).reshape(n, 64)
    return np.concatenate([ql, qh, sc.view(np.uint8), _f16(d)], axis=1).reshape(rows, -1)


def quantized(kind: str, x: np.ndarray) -> BlockTensor:
    return BlockTensor(kind, np.ascontiguousarray(quantize_blocks(kind, x)), x.shape[1])


def random_blocks(kind: str, rows: int, cols: int, rng: np.random.Generator, scale: float = 0.01) -> np.ndarray:
    """Random bytes in `kind`'s layout, every f16 scale finite: |N(scale, scale / 2)| (MXFP4's
    exponent byte: a power of two within 4 of scale / 4, its weights' halving included)."""
    _, per, nbytes = KINDS[kind]
    data = rng.integers(0, 256, (rows, cols // per * nbytes), dtype=np.uint8)
    blocks = data.reshape(rows, -1, nbytes)
    if kind == "MXFP4":
        blocks[..., 0] = 128 + np.rint(np.log2(scale / 4)) + rng.integers(-4, 5, blocks.shape[:2])
    for at in SCALE_BYTES.get(kind, []):
        blocks[..., at:at + 2] = _f16(np.abs(rng.normal(scale, scale / 2, blocks.shape[:2])))
    return data


def _metadata_type(value):
    from gguf.constants import GGUFValueType
    if isinstance(value, bool):
        return GGUFValueType.BOOL
    if isinstance(value, int):
        return GGUFValueType.INT32 if value < 0 else GGUFValueType.UINT32
    if isinstance(value, float):
        return GGUFValueType.FLOAT32
    return GGUFValueType.STRING


def requantize_gguf(src, dst, kind_of) -> None:
    """A copy of the GGUF file `src` whose tensors named in `kind_of` (name -> block type) are
    requantized from their dequantised values with this module's quantiser; the rest as they are."""
    import gguf
    from gguf.constants import GGUFValueType

    from radixserve.runtime.models.gguf_file import read_gguf

    fields, tensors = read_gguf(src)
    w = gguf.GGUFWriter(str(dst), fields["general.architecture"])
    for key, value in fields.items():
        if key in ("general.architecture", "general.alignment"):
            continue
        if isinstance(value, list):
            w.add_key_value(key, value, GGUFValueType.ARRAY, _metadata_type(value[0]))
        else:
            w.add_key_value(key, value, _metadata_type(value))
    for name, t in tensors.items():
        if name in kind_of:
            x = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32)
            kind = kind_of[name]
            w.add_tensor(name, quantize_blocks(kind, x.reshape(-1, int(t.shape[0]))),
                         raw_dtype=GGMLQuantizationType[kind])
        elif t.tensor_type.name in KINDS:
            w.add_tensor(name, np.ascontiguousarray(t.data), raw_dtype=t.tensor_type)
        else:
            w.add_tensor(name, np.ascontiguousarray(t.data))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
