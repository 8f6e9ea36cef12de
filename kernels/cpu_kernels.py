"""The CPU decode step's kernels (kernels/cpu_kernels.cpp): built for this machine's CPU on first
use, cached on disk, called through ctypes.

A decode step of a small model on the CPU is mostly per-op overhead (~35 ATen ops per layer before
these kernels) and, at long contexts, gathering K/V rows into copies before attending to them.
These kernels fuse each group of small ops into one call and read K/V straight from the pages;
`decoder_layer` runs a whole layer of a pure-decode step in one call
(runtime/models/fused_decode.py). Arguments that stay the same for a step or a layer go in as
structs built once (`BlockMatrix`, `PagedDecode`, `LayerWeights`, `DecodeStep`, mirroring the C++).

`load()` returns the kernels, or None where no C++ compiler works (the torch paths then serve,
with the same results up to float rounding). Build: `g++ -O3 -march=native -fopenmp`, about 25
seconds; the library lands in $RADIXSERVE_CACHE_DIR (default ~/.cache/radixserve), named by a
hash of the source, the flags, the compiler and the CPU's flags, so that a machine with another
CPU builds its own. Wrappers take tensors and check what the C side assumes (dtype, contiguity).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np
import torch

log = logging.getLogger("radixserve.kernels")

SOURCE = Path(__file__).with_name("cpu_kernels.cpp")
FLAGS = ["-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-fno-math-errno", "-shared", "-fPIC",
         "-std=c++17"]
SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}
MAX_HEAD_DIM = 512   # the kernels' stack buffers
NEG_INF_BITS = {torch.float32: 0xFF800000, torch.bfloat16: 0xFF80, torch.float16: 0xFC00}


def cache_dir() -> Path:
    return Path(os.environ.get("RADIXSERVE_CACHE_DIR") or Path.home() / ".cache" / "radixserve")


def _cpu_flags() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    return next((ln for ln in text.splitlines() if ln.startswith("flags")), "")


def _compiler() -> str:
    return os.environ.get("CXX", "g++")


def library_path() -> Path:
    cxx = _compiler()
    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        version = "none"
    key = hashlib.sha256("\0".join([SOURCE.read_text(), " ".join(FLAGS), cxx, version, _cpu_flags()])
                         .encode()).hexdigest()[:16]
    return cache_dir() / f"cpu_kernels-{key}.so"


def build(path: Path, flags: Sequence[str] = FLAGS, source: Path = SOURCE) -> None:
    """Compile `source` (the kernels' own, or another version of it: bench/gemm.py --against) into
    `path`; concurrent builders (test workers) each write their own file and rename it into place,
    so that a reader never sees half a library."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
    os.close(fd)
    try:
        subprocess.run([_compiler(), *flags, str(source), "-o", tmp], check=True, capture_output=True, text=True,
                       timeout=300)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


# Tokens an item of decode attention covers: few enough that one long context is split across
# every thread, enough that an item's fixed work is noise. An item of a group sharing a prefix
# scores every member's heads, and holds its scores (at most MAX_ITEM_SCORES) in cache.
ITEM_TOKENS = 256
MIN_ITEM_TOKENS = 32
MAX_ITEM_SCORES = 1 << 16


@dataclass
class DecodePlan:
    """How `decode_attention` splits a step's decodes into items (see kernels/cpu_kernels.cpp):
    built once a step, used by every layer."""
    items: torch.Tensor        # int32 [n, 5]: page-table row, first token, end token, first member, members
    members: torch.Tensor      # int32 [m]: the query row of each member (member i fills partial slot i)
    slot_start: torch.Tensor   # int32 [B + 1]: each query row's partial slots in `slots`
    slots: torch.Tensor        # int32 [m]
    partials: torch.Tensor     # float32 [m, heads, dim + 2], scratch
    max_members: int
    max_scores: int
    max_tokens: int

    @classmethod
    def of(cls, page_rows: Sequence[int], context_lens: Sequence[int], groups: Sequence[tuple[Sequence[int], int]],
           heads: int, dim: int, window: Optional[int] = None) -> "DecodePlan":
        """Query row i attends to the first context_lens[i] tokens of page-table row page_rows[i]
        (with `window`: to the last `window` of them, a sliding-window layer's; no groups then);
        `groups`: (rows, shared tokens) of rows whose contexts start on the same pages, which are
        then read once for all of them (the rows of a group read them through its first row's)."""
        assert window is None or not groups, "a group's shared pages may lie outside a member's window"
        items: list[tuple[int, int, int, int, int]] = []
        members: list[int] = []
        slots_of: list[list[int]] = [[] for _ in page_rows]

        # short contexts in items small enough that every thread gets one (one 130-token
        # context would otherwise be a single item, and one thread's work)
        threads = torch.get_num_threads()
        tokens = -(-sum(context_lens if window is None else (min(n, window) for n in context_lens)) // threads)
        item_tokens = min(ITEM_TOKENS, max(MIN_ITEM_TOKENS, -(-tokens // 8) * 8))

        def add(page_row: int, start: int, end: int, rows: Sequence[int]) -> None:
            step = min(item_tokens, max(16, MAX_ITEM_SCORES // (len(rows) * heads)))
            for s in range(start, end, step):
                items.append((page_row, s, min(end, s + step), len(members), len(rows)))
                for r in rows:
                    slots_of[r].append(len(members))
                    members.append(r)

        own_start = [0 if window is None else max(0, n - window) for n in context_lens]
        for rows, shared in groups:
            add(page_rows[rows[0]], 0, shared, rows)
            for r in rows:
                own_start[r] = shared
        for r, (row, length) in enumerate(zip(page_rows, context_lens)):
            add(row, own_start[r], length, [r])
        slot_start = [0]
        for s in slots_of:
            slot_start.append(slot_start[-1] + len(s))
        i32 = torch.int32
        return cls(items=torch.tensor(items, dtype=i32), members=torch.tensor(members, dtype=i32),
                   slot_start=torch.tensor(slot_start, dtype=i32),
                   slots=torch.tensor([j for s in slots_of for j in s], dtype=i32),
                   partials=torch.empty(len(members), heads, dim + 2),
                   max_members=max(n for *_, n in items),
                   max_scores=max((end - start) * n * heads for _, start, end, _, n in items),
                   max_tokens=max(end - start for _, start, end, _, _ in items))


MAX_SEGMENTS = 3   # row blocks of one BlockMatrix (q, k and v of one projection)


def block_matrix(parts: Sequence, bias: Optional[torch.Tensor] = None) -> "BlockMatrix":
    """The kernels' view of `parts` (runtime/models/quant.py's BlockTensors, of the same width)
    stacked along the output dim, and a float32 `bias` over all their rows. Built once: a linear
    layer runs ~120 times a decode step. Holds references to what it points into."""
    cols = parts[0].cols
    assert 1 <= len(parts) <= MAX_SEGMENTS and all(p.cols == cols for p in parts)
    rows = sum(p.rows for p in parts)
    assert bias is None or (bias.dtype == torch.float32 and bias.is_contiguous() and bias.shape == (rows,))
    m = BlockMatrix((BlockSegment * MAX_SEGMENTS)(*(block_segment(p) for p in parts)), len(parts), _ptr(bias),
                    rows, cols)
    m.keep = (parts, bias)
    return m


def block_segment(t) -> "BlockSegment":
    assert t.data.flags.c_contiguous and (t.row_map is None or t.row_map.dtype == np.int32)
    row_map = None if t.row_map is None else t.row_map.ctypes.data
    out_of = None if t.out_of is None else t.out_of.ctypes.data
    return BlockSegment(t.data.ctypes.data, row_map, out_of, t.data.shape[1], t.rows, t.kind_id)


def _ptr(t: Optional[torch.Tensor]) -> Optional[int]:
    return None if t is None else t.data_ptr()


# ---- the structs the C side takes (kernels/cpu_kernels.cpp, same names, same field order) ----------
_i64, _f32c, _vp = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p


class BlockSegment(ctypes.Structure):
    _fields_ = [("data", _vp), ("row_map", _vp), ("out_of", _vp), ("row_bytes", _i64), ("rows", _i64), ("kind", _i64)]


class BlockMatrix(ctypes.Structure):
    _fields_ = [("segment", BlockSegment * MAX_SEGMENTS), ("n_segments", _i64), ("bias", _vp), ("rows", _i64),
                ("cols", _i64)]


class PagedDecode(ctypes.Structure):
    _fields_ = [("k_cache", _vp), ("v_cache", _vp), ("layer_stride", _i64), ("table", _vp), ("table_stride", _i64),
                ("page_size", _i64), ("items", _vp), ("n_items", _i64), ("members", _vp), ("slot_start", _vp),
                ("slots", _vp), ("partials", _vp), ("max_members", _i64), ("max_scores", _i64),
                ("max_tokens", _i64), ("heads", _i64), ("kv_heads", _i64), ("d", _i64), ("scale", _f32c)]

    @classmethod
    def of(cls, k_cache: torch.Tensor, v_cache: torch.Tensor, table: torch.Tensor, plan: DecodePlan,
           scale: float) -> "PagedDecode":
        """A step's decodes as `plan` lays them out, on caches [layers, pages, page_size, kv_heads, dim]
        (any float dtype of SUFFIX) and the page table [requests, max pages] (int64)."""
        _, _, page_size, kv_heads, dim = k_cache.shape
        assert k_cache.is_contiguous() and v_cache.is_contiguous() and v_cache.shape == k_cache.shape
        assert table.dtype == torch.int64 and table.stride(1) == 1 and dim <= MAX_HEAD_DIM
        heads = plan.partials.shape[1]
        p = cls(k_cache.data_ptr(), v_cache.data_ptr(), k_cache.stride(0), table.data_ptr(), table.stride(0),
                page_size, plan.items.data_ptr(), plan.items.shape[0], plan.members.data_ptr(),
                plan.slot_start.data_ptr(), plan.slots.data_ptr(), plan.partials.data_ptr(), plan.max_members,
                plan.max_scores, plan.max_tokens, heads, kv_heads, dim, scale)
        p.keep, p.dtype = plan, k_cache.dtype
        return p


class LayerWeights(ctypes.Structure):
    _fields_ = [("qkv", BlockMatrix), ("o", BlockMatrix), ("gate_up", BlockMatrix), ("down", BlockMatrix),
                ("input_norm", _vp), ("post_norm", _vp), ("eps", _f32c), ("q_norm", _vp), ("k_norm", _vp)]


class DenseExperts(ctypes.Structure):
    _fields_ = [("gate_up", _vp), ("down", _vp), ("gate_up_bias", _vp), ("down_bias", _vp), ("experts", _i64),
                ("hidden", _i64), ("inter", _i64), ("clamped", _i64), ("limit", _f32c), ("alpha", _f32c)]

    @classmethod
    def of(cls, gate_up: Sequence[torch.Tensor], down: Sequence[torch.Tensor],
           gate_up_bias: Optional[Sequence[torch.Tensor]], down_bias: Optional[Sequence[torch.Tensor]],
           clamped: bool, limit: float, alpha: float) -> "DenseExperts":
        """A MoE layer's experts: contiguous weights gate_up [2I, H] (rows [gate | up]) and down
        [H, I], all float32 or all bfloat16, and float32 biases (or None); the tensors are kept
        alive with the struct."""
        dtype = gate_up[0].dtype
        inter, hidden = gate_up[0].shape[0] // 2, gate_up[0].shape[1]
        assert dtype in SUFFIX and all(w.dtype == dtype and w.is_contiguous() for w in (*gate_up, *down))
        assert all(w.shape == (2 * inter, hidden) for w in gate_up) and all(w.shape == (hidden, inter) for w in down)
        keep = [list(gate_up), list(down)]

        def table(ts):
            if ts is None:
                return None
            arr = (_vp * len(ts))(*[t.data_ptr() for t in ts])
            keep.append(arr)
            return ctypes.cast(arr, _vp)
        biases = [None if b is None else [t.float().contiguous() for t in b] for b in (gate_up_bias, down_bias)]
        keep += [b for b in biases if b is not None]
        m = cls(table(gate_up), table(down), table(biases[0]), table(biases[1]), len(gate_up), hidden, inter,
                int(clamped), limit, alpha)
        m.keep, m.dtype = keep, dtype
        return m


class BlockExperts(ctypes.Structure):
    _fields_ = [("gate_up", ctypes.POINTER(BlockMatrix)), ("down", ctypes.POINTER(BlockMatrix)), ("experts", _i64),
                ("hidden", _i64), ("inter", _i64), ("clamped", _i64), ("limit", _f32c), ("alpha", _f32c)]

    @classmethod
    def of(cls, gate_up: Sequence[BlockMatrix], down: Sequence[BlockMatrix], clamped: bool, limit: float,
           alpha: float) -> "BlockExperts":
        """A MoE layer's block-quantized experts: gate_up [2I, H] (rows [gate | up]) and down [H, I]
        per expert, as BlockLinear holds them (their blocks stay where they are)."""
        inter, hidden = gate_up[0].rows // 2, gate_up[0].cols
        assert all((g.rows, g.cols, d.rows, d.cols) == (2 * inter, hidden, hidden, inter)
                   for g, d in zip(gate_up, down))
        gu, dn = (BlockMatrix * len(gate_up))(*gate_up), (BlockMatrix * len(down))(*down)
        m = cls(gu, dn, len(gate_up), hidden, inter, int(clamped), limit, alpha)
        m.keep = (gu, dn, list(gate_up), list(down))
        return m


class DecodeStep(ctypes.Structure):
    _fields_ = [("x", _vp), ("delta", _vp), ("rows", _i64), ("cos", _vp), ("sin", _vp), ("positions", _vp),
                ("out_slots", _vp), ("attention", ctypes.POINTER(PagedDecode))]


class DecodeEnds(ctypes.Structure):
    _fields_ = [("embed", ctypes.POINTER(BlockSegment)), ("vocab", _i64), ("norm", _vp), ("eps", _f32c),
                ("head", ctypes.POINTER(BlockMatrix))]


class CpuKernels:
    """Typed entry points of the built library."""

    def __init__(self, lib: ctypes.CDLL):
        i64, f32, ptr = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
        self._fns = {}
        signatures = {
            "add_rms_norm": [ptr, ptr, i64, ptr, ptr, i64, i64, f32],
            "rope": [ptr, i64, i64, i64, i64, ptr, ptr, ptr],
            "silu_mul": [ptr, i64, i64, ptr],
            "write_kv": [ptr, ptr, ptr, ptr, i64, ptr, i64, i64, i64],
            "decode_attention": [ctypes.POINTER(PagedDecode), i64, ptr, i64, i64, ptr, ptr],
        }
        for name, args in signatures.items():
            for suffix in SUFFIX.values():
                fn = getattr(lib, f"rs_{name}_{suffix}")
                fn.argtypes, fn.restype = args, None
                self._fns[name, suffix] = fn
        self._block_linear = lib.rs_block_linear
        self._block_linear.argtypes, self._block_linear.restype = [ctypes.POINTER(BlockMatrix), ptr, i64, ptr], None
        self._block_gemm = lib.rs_block_gemm
        self._block_gemm.argtypes, self._block_gemm.restype = [ctypes.POINTER(BlockMatrix), ptr, i64, ptr], None
        lib.rs_int8_gemm_available.restype = i64
        # block_gemm's own int8 panels (a CPU with VNNI); else it is block_linear
        self.int8_gemm = bool(lib.rs_int8_gemm_available())
        self._dequantize_rows = lib.rs_dequantize_rows
        self._dequantize_rows.argtypes = [ctypes.POINTER(BlockSegment), i64, ptr, i64, ptr]
        self._dequantize_rows.restype = None
        self._dequantize_panel = lib.rs_dequantize_panel_bf16
        self._dequantize_panel.argtypes, self._dequantize_panel.restype = [ctypes.POINTER(BlockMatrix), i64, i64, ptr], None
        self._decoder_layer = lib.rs_decoder_layer
        self._decoder_layer.argtypes = [ctypes.POINTER(LayerWeights), ctypes.POINTER(DecodeStep), i64, i64]
        self._decoder_layer.restype = None
        self._decoder_layers = lib.rs_decoder_layers
        self._decoder_layers.argtypes = [ctypes.POINTER(ctypes.POINTER(LayerWeights)), ctypes.POINTER(i64), i64,
                                         ctypes.POINTER(DecodeStep)]
        self._decoder_layers.restype = None
        self._decoder_model = lib.rs_decoder_model
        self._decoder_model.argtypes = [ctypes.POINTER(ctypes.POINTER(LayerWeights)), ctypes.POINTER(i64), i64,
                                        ctypes.POINTER(DecodeStep), ctypes.POINTER(DecodeEnds), ptr, ptr]
        self._decoder_model.restype = i64
        for suffix in SUFFIX.values():
            fn = getattr(lib, f"rs_dense_experts_{suffix}")
            fn.argtypes, fn.restype = [ctypes.POINTER(DenseExperts), ptr, i64, ptr, ptr, i64, ptr], None
            self._fns["dense_experts", suffix] = fn
        self._head_rms_norms = lib.rs_head_rms_norms
        self._head_rms_norms.argtypes, self._head_rms_norms.restype = [ptr, i64, i64, i64, i64, i64, ptr, ptr, f32], None
        self._block_experts = lib.rs_block_experts
        self._block_experts.argtypes = [ctypes.POINTER(BlockExperts), ptr, i64, ptr, ptr, i64, ptr]
        self._block_experts.restype = None
        self._argmax_rows = lib.rs_argmax_rows
        self._argmax_rows.argtypes = [ptr, i64, i64, i64, ptr]
        self._argmax_rows.restype = None
        self._token_bitmask = lib.rs_token_bitmask
        self._token_bitmask.argtypes = [ptr, i64, i64, ptr, i64, ptr, i64, i64, i64, i64]
        self._token_bitmask.restype = None

    def fn(self, name: str, dtype: torch.dtype):
        return self._fns[name, SUFFIX[dtype]]

    # ---- wrappers (tensors in, checks the C side relies on) ---------------------------------------
    def add_rms_norm(self, x: torch.Tensor, delta: Optional[torch.Tensor], weight: torch.Tensor, eps: float,
                     dtype: torch.dtype) -> torch.Tensor:
        """x += delta in place (x: contiguous float32 [T, d]; delta: [T, d] rows of unit stride in
        `dtype`), then rms_norm(x) * weight in `dtype`."""
        t, d = x.shape
        assert x.dtype == torch.float32 and x.is_contiguous() and weight.dtype == torch.float32
        out = torch.empty(t, d, dtype=dtype)
        stride = 0
        if delta is not None:
            assert delta.dtype == dtype and delta.shape == x.shape and delta.stride(1) == 1
            stride = delta.stride(0)
        self.fn("add_rms_norm", dtype)(x.data_ptr(), None if delta is None else delta.data_ptr(), stride,
                                       weight.data_ptr(), out.data_ptr(), t, d, eps)
        return out

    def rope_(self, x: torch.Tensor, heads: int, head_dim: int, cos: torch.Tensor, sin: torch.Tensor,
              positions: torch.Tensor) -> None:
        """Rotate the first `heads` heads of each row of x [T, >= heads * head_dim] (unit stride in
        a row) in place, with rows `positions` of the [max_len, head_dim] tables of rope.py."""
        assert x.stride(1) == 1 and cos.is_contiguous() and sin.is_contiguous() and cos.dtype == x.dtype
        assert positions.dtype == torch.int64 and positions.is_contiguous() and head_dim <= MAX_HEAD_DIM
        self.fn("rope", x.dtype)(x.data_ptr(), x.stride(0), x.shape[0], heads, head_dim, cos.data_ptr(),
                                 sin.data_ptr(), positions.data_ptr())

    def head_rms_norms_(self, qk: torch.Tensor, heads: int, q_norm: torch.Tensor, k_norm: torch.Tensor,
                        eps: float) -> None:
        """qk [T, heads + kv_heads, d] float32 (heads contiguous, rows any stride): each of the
        first `heads` heads RMS-normed times q_norm [d], each after times k_norm, in place."""
        t, n, d = qk.shape
        assert qk.dtype == q_norm.dtype == k_norm.dtype == torch.float32 and qk.stride(2) == 1 and qk.stride(1) == d
        assert q_norm.is_contiguous() and k_norm.is_contiguous() and q_norm.numel() == k_norm.numel() == d
        self._head_rms_norms(qk.data_ptr(), qk.stride(0), t, heads, n - heads, d, q_norm.data_ptr(),
                             k_norm.data_ptr(), eps)

    def write_kv(self, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor) -> None:
        """k, v [T, kv_heads, dim] (a row's heads contiguous) to `slots` of caches [.., kv_heads, dim]."""
        t, kv_heads, dim = k.shape
        assert k_cache.is_contiguous() and v_cache.is_contiguous() and slots.dtype == torch.int64
        assert k.stride()[1:] == (dim, 1) and v.stride()[1:] == (dim, 1) and k.dtype == k_cache.dtype == v.dtype
        self.fn("write_kv", k.dtype)(k_cache.data_ptr(), v_cache.data_ptr(), slots.data_ptr(), k.data_ptr(),
                                     k.stride(0), v.data_ptr(), v.stride(0), t, kv_heads * dim)

    def decode_attention(self, q: torch.Tensor, paged: PagedDecode, layer: int,
                         sinks: Optional[torch.Tensor] = None) -> torch.Tensor:
        """One query per row of q [B, heads, dim] (a row's heads contiguous) against layer `layer`'s
        KV pages, as `paged` lays them out; `sinks`: [heads] float32 logits that join each head's
        softmax and weigh nothing (gpt-oss) -> [B, heads, dim]."""
        b, heads, dim = q.shape
        assert q.stride()[1:] == (dim, 1) and q.dtype == paged.dtype and (heads, dim) == (paged.heads, paged.d)
        assert sinks is None or (sinks.dtype == torch.float32 and sinks.is_contiguous() and sinks.shape == (heads,))
        out = torch.empty(b, heads, dim, dtype=q.dtype)
        self.fn("decode_attention", q.dtype)(ctypes.byref(paged), layer, q.data_ptr(), q.stride(0), b, _ptr(sinks),
                                             out.data_ptr())
        return out

    def block_linear(self, x: torch.Tensor, m: BlockMatrix) -> torch.Tensor:
        """x [T, cols] float32 times a block-quantized weight [rows, cols]^T (+ its bias) -> float32 [T, rows]."""
        n, cols = x.shape
        assert x.dtype == torch.float32 and x.is_contiguous() and cols == m.cols
        out = torch.empty(n, m.rows)
        self._block_linear(ctypes.byref(m), x.data_ptr(), n, out.data_ptr())
        return out

    def block_gemm(self, x: torch.Tensor, m: BlockMatrix) -> torch.Tensor:
        """block_linear for a prefill's many rows, on int8 panels of the weight (where `int8_gemm`;
        cols a multiple of 256). Its rounding is its own: activations to int8 per 256 values."""
        n, cols = x.shape
        assert x.dtype == torch.float32 and x.is_contiguous() and cols == m.cols and cols % 256 == 0
        out = torch.empty(n, m.rows)
        self._block_gemm(ctypes.byref(m), x.data_ptr(), n, out.data_ptr())
        return out

    def dequantize_rows(self, t, ids: torch.Tensor, segment: Optional[BlockSegment] = None) -> torch.Tensor:
        """Rows `ids` (int64) of a BlockTensor as float32 [len(ids), cols], exactly as the gguf
        package dequantises them. `segment`: t's, where the caller keeps one (a lookup every step)."""
        assert ids.dtype == torch.int64 and ids.is_contiguous() and ids.dim() == 1
        if len(ids):
            low, high = (int(v) for v in torch.aminmax(ids))
            if not (0 <= low and high < t.rows):
                raise IndexError("row id out of range")
        out = torch.empty(len(ids), t.cols)
        segment = block_segment(t) if segment is None else segment
        self._dequantize_rows(ctypes.byref(segment), t.cols, ids.data_ptr(), len(ids), out.data_ptr())
        return out

    def dequantize_panel_bf16(self, m: BlockMatrix, r0: int, r1: int) -> torch.Tensor:
        """Rows [r0, r1) of a block-quantized weight (its segments stacked) as bfloat16 [r1 - r0, cols]:
        the dequantised values, rounded to nearest even."""
        assert 0 <= r0 <= r1 <= m.rows
        out = torch.empty(r1 - r0, m.cols, dtype=torch.bfloat16)
        self._dequantize_panel(ctypes.byref(m), r0, r1, out.data_ptr())
        return out

    def decoder_layer(self, weights: LayerWeights, step: DecodeStep, layer: int, has_delta: bool) -> None:
        """One decoder layer over `step` (see kernels/cpu_kernels.cpp and runtime/models/fused_decode.py)."""
        self._decoder_layer(ctypes.byref(weights), ctypes.byref(step), layer, has_delta)

    def decoder_layers(self, weights: "ctypes.Array", layers: "ctypes.Array", step: DecodeStep) -> None:
        """decoder_layer for each of `weights` (pointers to LayerWeights) on KV cache layers `layers`
        (int64) in turn, the first without a delta: a step's layers in one call."""
        assert len(weights) == len(layers)
        self._decoder_layers(weights, layers, len(weights), ctypes.byref(step))

    def decoder_model(self, weights: "ctypes.Array", layers: "ctypes.Array", step: DecodeStep, ends: DecodeEnds,
                      ids: torch.Tensor) -> torch.Tensor:
        """A whole decode step: `ends`' embedding rows of `ids` (int64 [rows]) into step.x (where
        ends has an embedding; else step.x comes filled), decoder_layers, the final norm and the LM
        head -> float32 logits [rows, head rows], as the separate calls compute them."""
        assert len(weights) == len(layers) and ids.dtype == torch.int64 and ids.is_contiguous()
        assert ids.shape[0] == step.rows
        out = torch.empty(step.rows, ends.head.contents.rows)
        if self._decoder_model(weights, layers, len(weights), ctypes.byref(step), ctypes.byref(ends), ids.data_ptr(),
                               out.data_ptr()) < 0:
            raise IndexError("token id out of range")
        return out

    def experts(self, m: Union[DenseExperts, BlockExperts], x: torch.Tensor, ids: torch.Tensor,
                weights: torch.Tensor) -> torch.Tensor:
        """x [T, hidden] float32 through each token's experts `ids` [T, k] (distinct in a row),
        weighted by `weights` [T, k] float32 and added in expert order -> float32 [T, hidden]."""
        t, hidden = x.shape
        assert x.dtype == torch.float32 and x.is_contiguous() and hidden == m.hidden
        assert ids.dtype == torch.int64 and ids.is_contiguous() and ids.shape[0] == t
        assert weights.dtype == torch.float32 and weights.is_contiguous() and weights.shape == ids.shape
        if t and not (0 <= int(ids.min()) and int(ids.max()) < m.experts):
            raise IndexError("expert id out of range")
        out = torch.empty(t, hidden)
        fn = self._block_experts if isinstance(m, BlockExperts) else self.fn("dense_experts", m.dtype)
        fn(ctypes.byref(m), x.data_ptr(), t, ids.data_ptr(), weights.data_ptr(), ids.shape[1], out.data_ptr())
        return out

    def argmax_rows(self, x: torch.Tensor) -> torch.Tensor:
        """x.argmax(-1) of float32 rows [rows, n] of unit column stride (the first index on ties;
        the first NaN where a row has one)."""
        assert x.dtype == torch.float32 and x.dim() == 2 and x.stride(1) == 1 and x.device.type == "cpu"
        out = torch.empty(x.shape[0], dtype=torch.int64)
        self._argmax_rows(x.data_ptr(), x.stride(0), x.shape[0], x.shape[1], out.data_ptr())
        return out

    def token_bitmask_(self, logits: torch.Tensor, bitmask: torch.Tensor, rows: Optional[Sequence[int]],
                       limit: int) -> None:
        """logits[r, t] = -inf where bit t of bitmask[r] is clear or t >= limit, for r in `rows`
        (every row when None); in place. Logits: float32, bfloat16 or float16 with unit column
        stride; bitmask: int32 with unit column stride and at least `limit` bits a row."""
        assert logits.dtype in NEG_INF_BITS and logits.stride(1) == 1 and logits.device.type == "cpu"
        assert bitmask.dtype == torch.int32 and bitmask.stride(1) == 1 and bitmask.device.type == "cpu"
        assert 0 <= limit <= min(logits.shape[1], 32 * bitmask.shape[1])
        if rows is None:
            assert bitmask.shape[0] >= logits.shape[0]
            n, index = logits.shape[0], None
        else:
            n = len(rows)
            if n and not (0 <= min(rows) and max(rows) < min(logits.shape[0], bitmask.shape[0])):
                raise IndexError("bitmask row out of range")
            index = (ctypes.c_int64 * n)(*rows)
        if n:
            self._token_bitmask(logits.data_ptr(), logits.element_size(), logits.stride(0), bitmask.data_ptr(),
                                bitmask.stride(0), index, n, logits.shape[1], limit, NEG_INF_BITS[logits.dtype])

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up for contiguous rows [gate | up]."""
        assert gate_up.is_contiguous()
        t, width = gate_up.shape
        out = torch.empty(t, width // 2, dtype=gate_up.dtype)
        self.fn("silu_mul", gate_up.dtype)(gate_up.data_ptr(), t, width // 2, out.data_ptr())
        return out


@functools.cache
def load() -> Optional[CpuKernels]:
    """The kernels, built if needed; None where they cannot be built or loaded."""
    if os.environ.get("RADIXSERVE_DISABLE_CPU_KERNELS"):
        return None
    try:
        path = library_path()
        if not path.exists():
            build(path)
        return CpuKernels(ctypes.CDLL(str(path)))
    except (OSError, subprocess.SubprocessError, AttributeError) as e:
        detail = getattr(e, "stderr", "") or ""
        log.warning("CPU kernels unavailable, using the torch paths: %s %s", e, detail[-2000:])
        return None
