"""Token-bitmask apply: set the logits of disallowed tokens to -inf, in place, for the constrained
rows of a batch only.

Bitmask layout (xgrammar's): int32 [rows, ceil(vocab / 32)]; bit j of word w set means token
w * 32 + j is allowed. `rows` (a list of ints or a LongTensor, or None for rows 0..B-1) lists
the logits rows to mask, and the same index picks the bitmask row: logits[r] is masked by
bitmask[r] for r in rows. The engine keeps one bitmask of max_running rows and fills the rows
of its constrained requests.
Columns that no bit covers (logits wider than 32 * words) and columns at or beyond `vocab_size`
are disallowed for masked rows. Rows not listed are never written.

Four implementations, all with that contract:
- `apply_token_bitmask_reference`: obvious torch (unpack bits, masked_fill). Tests compare to it.
- `apply_token_bitmask_native`: the CPU path: one pass over the listed rows in
  kernels/cpu_kernels.cpp, selecting bits in the logits' own width (bench/bitmask.py). It is built
  with the other CPU kernels, so nothing compiles at start-up (inductor's version of the same pass
  took 5-12 s to compile in each process). Where those kernels are not built it falls back to:
- `apply_token_bitmask_torch`: eager torch: one pass over the masked rows plus work on the few
  partly allowed words (see `_mask_words_eager`), instead of unpacking every bit.
- `apply_token_bitmask_triton`: the CUDA kernel (writes -inf where a bit is clear, never reads logits).
`apply_token_bitmask_` picks by device.
"""
from __future__ import annotations

import sys
from typing import Optional, Sequence, Union

import numpy as np
import torch

from radixserve.kernels import cpu_kernels

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs without triton: the torch path serves every device
    triton = None

_SHIFTS = torch.arange(32, dtype=torch.int32)
_NEG_INF = float("-inf")


# Rows to mask: a list (what the engine passes on the CPU: no tensor to build and read back), an
# index tensor, or None for all rows.
Rows = Optional[Union[Sequence[int], torch.Tensor]]


def _check(logits: torch.Tensor, bitmask: torch.Tensor, rows: Rows) -> int:
    """Validate shapes; returns the number of masked rows."""
    if logits.dim() != 2 or bitmask.dim() != 2:
        raise ValueError("logits must be [B, V] and bitmask [rows, words]")
    if bitmask.dtype != torch.int32:
        raise ValueError(f"bitmask must be int32, got {bitmask.dtype}")
    if rows is None:
        if bitmask.shape[0] < logits.shape[0]:
            raise ValueError(f"bitmask has {bitmask.shape[0]} rows for {logits.shape[0]} logits rows")
        return logits.shape[0]
    if isinstance(rows, torch.Tensor) and rows.dim() != 1:
        raise ValueError("rows must be a 1-D index tensor")
    return len(rows)


def _row_list(rows: Rows) -> Optional[list[int]]:
    return None if rows is None else rows.tolist() if isinstance(rows, torch.Tensor) else list(rows)


def _limit(logits: torch.Tensor, bitmask: torch.Tensor, vocab_size: Optional[int]) -> int:
    """Columns below the limit follow their bit; the rest are disallowed."""
    limit = min(logits.shape[1], bitmask.shape[1] * 32)
    return limit if vocab_size is None else max(0, min(limit, vocab_size))


def pack_bitmask(allowed: torch.Tensor) -> torch.Tensor:
    """bool [R, V] -> int32 bitmask [R, ceil(V / 32)] (for tests and benchmarks)."""
    rows, vocab = allowed.shape
    padded = torch.zeros(rows, (vocab + 31) // 32 * 32, dtype=torch.int64, device=allowed.device)
    padded[:, :vocab] = allowed.long()
    words = (padded.view(rows, -1, 32) << torch.arange(32, device=allowed.device)).sum(-1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


# ---- reference -------------------------------------------------------------------------------
def apply_token_bitmask_reference(logits: torch.Tensor, bitmask: torch.Tensor,
                                  rows: Rows = None,
                                  vocab_size: Optional[int] = None) -> None:
    """Unpack every bit and masked_fill each listed row (simple and slow)."""
    _check(logits, bitmask, rows)
    limit = _limit(logits, bitmask, vocab_size)
    row_list = range(logits.shape[0]) if rows is None else _row_list(rows)
    shifts = _SHIFTS.to(bitmask.device)
    for r in row_list:
        bits = ((bitmask[r].unsqueeze(-1) >> shifts) & 1).bool().reshape(-1)
        allowed = torch.zeros(logits.shape[1], dtype=torch.bool, device=logits.device)
        allowed[:limit] = bits[:limit]
        logits[r].masked_fill_(~allowed, _NEG_INF)


# ---- vectorised torch (CPU) ------------------------------------------------------------------
_BYTE_ORDER_OK = sys.byteorder == "little"  # the byte-table path reads int32 words as 4 bytes
_BOUND_CACHE: dict[tuple[torch.dtype, torch.device], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}


def _bounds(dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(+inf, -inf) scalars and a [256, 8] table: for each byte value, the upper bound of each of
    its 8 tokens (+inf if the bit is set, else -inf), all in the logits' dtype."""
    key = (dtype, device)
    if key not in _BOUND_CACHE:
        bits = (torch.arange(256).unsqueeze(1) >> torch.arange(8)) & 1
        table = torch.where(bits.bool(), float("inf"), _NEG_INF).to(dtype=dtype, device=device)
        _BOUND_CACHE[key] = (torch.tensor(float("inf"), dtype=dtype, device=device),
                             torch.tensor(_NEG_INF, dtype=dtype, device=device), table.contiguous())
    return _BOUND_CACHE[key]


def apply_token_bitmask_torch(logits: torch.Tensor, bitmask: torch.Tensor,
                              rows: Rows = None,
                              vocab_size: Optional[int] = None) -> None:
    """Eager CPU path (other devices fall back to the reference); see `_mask_words_eager`.
    Fastest when the masked rows are one block (rows None or consecutive): the words are masked
    on a view. Scattered rows are gathered, masked and written back."""
    n_rows = _check(logits, bitmask, rows)
    if n_rows == 0:
        return
    limit = _limit(logits, bitmask, vocab_size)
    row_list = _row_list(rows)  # a tensor is read once: small tensor ops cost ~10 us each here
    first = _contiguous_range_start(row_list)
    repeated_rows = first is None and len(set(row_list)) != len(row_list)
    if not _BYTE_ORDER_OK or logits.device.type != "cpu" or logits.stride(1) != 1 or repeated_rows:
        apply_token_bitmask_reference(logits, bitmask, rows, vocab_size)  # rare layouts: the simple path
        return
    bitmask = bitmask.cpu()
    if first is not None:  # masked rows form one block: work on a view (slices cost ~2 us each)
        whole = first == 0 and n_rows == logits.shape[0]
        block = logits if whole else logits[first:first + n_rows]
        _mask_block(block, bitmask if whole and n_rows == bitmask.shape[0] else bitmask[first:first + n_rows],
                    limit)
    else:  # scattered rows: gather them, mask, put them back
        index = torch.tensor(row_list)
        block = logits.index_select(0, index)
        _mask_block(block, bitmask.index_select(0, index), limit)
        logits.index_copy_(0, index, block)


def _contiguous_range_start(rows: Optional[list[int]]) -> Optional[int]:
    """rows[0] when rows are r, r+1, ..., r+n-1 (or 0 when rows is None), else None."""
    if rows is None:
        return 0
    if not rows:
        return None
    start = rows[0]
    return start if rows == list(range(start, start + len(rows))) else None


def _mask_block(block: torch.Tensor, words: torch.Tensor, limit: int) -> None:
    """Mask every row of `block` ([R, V] on the CPU, unit column stride) with `words` ([R, W])."""
    n_rows = block.shape[0]
    full = limit // 32  # words whose 32 tokens are all below the limit
    if full:
        main = block if full * 32 == block.shape[1] else block[:, :full * 32]
        _mask_words_eager(main.view(n_rows, full, 32), words if full == words.shape[1] else words[:, :full])
    tail = block.shape[1] - full * 32
    if tail:  # the last, partly covered word and anything beyond the limit
        cols = torch.arange(full * 32, block.shape[1])
        allowed = cols < limit
        if limit > full * 32:
            word = words[:, full].unsqueeze(-1)
            allowed = allowed & (((word >> (cols - full * 32).clamp(max=31).to(torch.int32)) & 1) == 1)
        else:
            allowed = allowed.expand(n_rows, -1)
        block[:, full * 32:].masked_fill_(~allowed, _NEG_INF)


def _mask_words_eager(main: torch.Tensor, words: torch.Tensor) -> None:
    """Grammar masks are mostly whole words: 0 (32 disallowed tokens) or -1 (32 allowed). One pass
    over the rows takes the minimum of each logit and its word's bound (-inf for a zero word, +inf
    otherwise; skipped when no word is zero, as for rows inside a JSON string). Then only the
    partly allowed words are handled: mostly clear ones (sparse rows) get a per-token bound from a
    byte table, mostly set ones (dense rows) get -inf at each clear bit. When over half the words
    are partly allowed (random masks), the byte table bounds every token instead. min() rather
    than add(): a disallowed +inf logit still ends at -inf (a NaN logit stays NaN). Word-level
    bookkeeping runs in numpy: on ~50k words it is several times cheaper than torch."""
    n_rows, full, _ = main.shape
    pos_inf, neg_inf, table = _bounds(main.dtype, main.device)
    w = words.numpy()
    zero = w == 0
    partial = np.flatnonzero(~(zero | (w == -1)))  # partly allowed words
    if partial.size * 2 > w.size:
        _min_with_table(main, words, table, out=main)
        return
    if zero.any():  # all-allowed rows (inside a JSON string) skip the full pass
        torch.minimum(main, _word_bounds(zero, main.dtype, pos_inf, neg_inf).unsqueeze(-1), out=main)
    if partial.size:
        partial_words = np.ascontiguousarray(w.reshape(-1)[partial])
        bits = np.unpackbits(partial_words.view(np.uint8), bitorder="little")
        mostly_clear = bits.size - np.count_nonzero(bits) > 4 * partial.size
        if mostly_clear and main.is_contiguous():
            # few allowed tokens in these words (sparse rows): bound their logits bit by bit
            words_of, index = main.view(n_rows * full, 32), torch.from_numpy(partial)
            picked = words_of.index_select(0, index)
            _min_with_table(picked, torch.from_numpy(partial_words), table, out=picked)
            words_of.index_copy_(0, index, picked)
        else:  # few disallowed tokens (dense rows): -inf at each clear bit
            _clear_bits(main, bits, partial, neg_inf)


# +inf and -inf differ only in the sign bit: (integer view, sign bit position, +inf bits)
_INF_BITS = {torch.float32: (np.int32, 31, 0x7F800000), torch.bfloat16: (np.int16, 15, 0x7F80),
             torch.float16: (np.int16, 15, 0x7C00)}


def _word_bounds(zero: np.ndarray, dtype: torch.dtype, pos_inf: torch.Tensor, neg_inf: torch.Tensor) -> torch.Tensor:
    """-inf where a word is zero, +inf elsewhere, in `dtype` (built from bits: no float compare)."""
    if dtype in _INF_BITS:
        itype, sign, inf_bits = _INF_BITS[dtype]
        return torch.from_numpy((zero.astype(itype) << sign) | inf_bits).view(dtype)
    return torch.where(torch.from_numpy(zero), neg_inf, pos_inf)


def _min_with_table(logits_words: torch.Tensor, words: torch.Tensor, table: torch.Tensor,
                    out: torch.Tensor) -> None:
    """out = min(logits, per-token bound) with the bounds looked up byte by byte ([..., 32] logits
    for [...] words; int32 words are read as 4 little-endian bytes)."""
    bounds = table.index_select(0, words.contiguous().view(torch.uint8).reshape(-1).int())
    torch.minimum(logits_words, bounds.view(logits_words.shape), out=out)


def _clear_bits(main: torch.Tensor, bits: np.ndarray, partial: np.ndarray, neg_inf: torch.Tensor) -> None:
    """-inf at every clear bit of the partly allowed words: `main` is the [R, W, 32] logits view,
    `bits` the words' bits unpacked (32 a word, lowest first), `partial` their flat word indices."""
    clear = np.flatnonzero(bits == 0)  # k -> bit k % 32 of partial word k // 32
    word, bit = partial[clear >> 5], clear & 31
    if main.is_contiguous():
        main.view(-1).index_fill_(0, torch.from_numpy(word * 32 + bit), neg_inf)
    else:
        full = main.shape[1]
        main.index_put_((torch.from_numpy(word // full), torch.from_numpy(word % full), torch.from_numpy(bit)),
                        neg_inf)


# ---- C++ (CPU) -------------------------------------------------------------------------------
def apply_token_bitmask_native(logits: torch.Tensor, bitmask: torch.Tensor,
                               rows: Rows = None,
                               vocab_size: Optional[int] = None) -> None:
    """kernels/cpu_kernels.cpp's pass over the listed rows (the eager path where those kernels are
    not built, or for logits without unit column stride)."""
    kernels = cpu_kernels.load()
    if kernels is None or logits.device.type != "cpu" or logits.stride(1) != 1:
        apply_token_bitmask_torch(logits, bitmask, rows, vocab_size)
        return
    _check(logits, bitmask, rows)
    bitmask = bitmask.cpu()
    kernels.token_bitmask_(logits, bitmask if bitmask.stride(1) == 1 else bitmask.contiguous(), _row_list(rows),
                           _limit(logits, bitmask, vocab_size))


# ---- Triton (CUDA) ---------------------------------------------------------------------------
if triton is not None:
    @triton.jit
    def _apply_bitmask_kernel(logits_ptr, bitmask_ptr, rows_ptr, logits_row_stride, bitmask_row_stride,
                              n_cols, limit, HAS_ROWS: tl.constexpr, BLOCK: tl.constexpr):
        # one program per (masked row, block of columns); writes -inf where the bit is clear
        if HAS_ROWS:
            row = tl.load(rows_ptr + tl.program_id(0)).to(tl.int64)
        else:
            row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        covered = cols < limit
        words = tl.load(bitmask_ptr + row * bitmask_row_stride + cols // 32, mask=covered, other=0)
        allowed = ((words >> (cols % 32)) & 1) != 0
        kill = (cols < n_cols) & ~(covered & allowed)
        neg_inf = tl.full([BLOCK], float("-inf"), logits_ptr.dtype.element_ty)
        tl.store(logits_ptr + row * logits_row_stride + cols, neg_inf, mask=kill)


def apply_token_bitmask_triton(logits: torch.Tensor, bitmask: torch.Tensor,
                               rows: Rows = None,
                               vocab_size: Optional[int] = None, block: int = 2048) -> None:
    """Triton kernel. `bitmask` must already be on the logits' device (copy the filled rows over
    with non_blocking=True from pinned memory), and so should `rows`: a list is uploaded here, and
    a copy from pageable memory waits for everything queued on the stream."""
    if triton is None:
        raise RuntimeError("triton is not installed")
    n_rows = _check(logits, bitmask, rows)
    if n_rows == 0:
        return
    if logits.stride(1) != 1 or bitmask.stride(1) != 1:
        raise ValueError("logits and bitmask need unit column stride")
    limit = _limit(logits, bitmask, vocab_size)
    # without rows the kernel never reads rows_ptr; any tensor will do
    rows_arg = torch.as_tensor(rows, dtype=torch.int64, device=logits.device) if rows is not None else bitmask
    grid = (n_rows, triton.cdiv(logits.shape[1], block))
    _apply_bitmask_kernel[grid](logits, bitmask, rows_arg, logits.stride(0), bitmask.stride(0),
                                logits.shape[1], limit, HAS_ROWS=rows is not None, BLOCK=block)


def compile_variants() -> list:
    """The kernel's specialisations as the engine launches it (float32 logits), for compiling ahead
    of time (kernels/triton_attention.py: KernelVariant)."""
    from radixserve.kernels.triton_attention import KernelVariant
    signature = dict(logits_ptr="*fp32", bitmask_ptr="*i32", rows_ptr="*i64", logits_row_stride="i32",
                     bitmask_row_stride="i32", n_cols="i32", limit="i32")
    return [KernelVariant(f"bitmask apply, rows {has_rows}", _apply_bitmask_kernel, signature,
                          dict(HAS_ROWS=has_rows, BLOCK=2048)) for has_rows in (True, False)]


# ---- dispatch --------------------------------------------------------------------------------
def apply_token_bitmask_(logits: torch.Tensor, bitmask: torch.Tensor,
                         rows: Rows = None, vocab_size: Optional[int] = None) -> None:
    """Set logits[r, t] = -inf for every r in `rows` (all rows when None) and every token t that
    bitmask[r] does not allow (or t >= vocab_size). In place; other rows are not touched."""
    if logits.device.type == "cpu":
        apply_token_bitmask_native(logits, bitmask, rows, vocab_size)
    elif logits.device.type == "cuda" and triton is not None:
        apply_token_bitmask_triton(logits, bitmask.to(logits.device, non_blocking=True), rows, vocab_size)
    else:  # any other device: the reference, on the logits' device
        apply_token_bitmask_reference(logits, bitmask.to(logits.device), rows, vocab_size)
