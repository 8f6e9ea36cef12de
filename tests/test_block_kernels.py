"""The linear layers on a GGUF file's block-quantized weights (kernels/cpu_kernels.cpp): every
block type dequantises as the gguf package's reference does, bit for bit; products are float64
matmuls of the dequantised weights up to the activations' int8 rounding; stacked segments, row
maps and batch sizes change nothing but which rows are computed."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.kernels import cpu_kernels
from radixserve.kernels.cpu_kernels import CpuKernels, block_matrix, load
from radixserve.runtime.models.quant import KINDS, BlockTensor

from .kquants import LEGACY, SCALE_BYTES, random_blocks

KERNELS = load()
assert KERNELS is not None, "the CPU kernels did not build"


def random_tensor(kind: str, rows: int, cols: int, seed: int) -> BlockTensor:
    return BlockTensor(kind, random_blocks(kind, rows, cols, np.random.default_rng(seed)), cols)


def extreme_tensor(kind: str) -> BlockTensor:
    """12 rows of two blocks: extreme f16 scales (the largest, a subnormal, zero, negative) in rows
    0-5, all-zero blocks in row 6."""
    rng = np.random.default_rng(1)
    per, nbytes = KINDS[kind][1:]
    data = random_blocks(kind, 12, 2 * per, rng)
    blocks = data.reshape(12, 2, nbytes)
    for row, value in enumerate([65504.0, -65504.0, 2.0 ** -24, 0.0, -0.5, 1e-3]):
        for at in SCALE_BYTES.get(kind, []):
            blocks[row, 0, at:at + 2] = np.array([value], np.float16).view(np.uint8)
    if kind == "MXFP4":   # its exponent byte: the largest (weights overflow to inf), the subnormal two
        blocks[:6, 0, 0] = [255, 254, 1, 0, 127, 2]
    blocks[6] = 0
    return BlockTensor(kind, data, 2 * per)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_dequantised_rows_equal_the_gguf_reference_bit_for_bit(kind):
    """Including extreme f16 scales and all-zero blocks (extreme_tensor)."""
    t = extreme_tensor(kind)
    got = KERNELS.dequantize_rows(t, torch.arange(12)).numpy()
    assert np.array_equal(got.view(np.uint32), t.dequantize().view(np.uint32))


def test_dequantised_rows_follow_the_row_map():
    t = random_tensor("Q4_K", 10, 256, 0).reordered(np.array([3, 1, 4, 1, 5, 9, 2, 6]))
    got = KERNELS.dequantize_rows(t, torch.tensor([7, 0, 2]))
    assert np.array_equal(got.numpy(), t.dequantize()[[7, 0, 2]])


def test_dequantising_a_row_out_of_range_raises():
    with pytest.raises(IndexError):
        KERNELS.dequantize_rows(random_tensor("Q8_0", 4, 32, 0), torch.tensor([4]))


def rounding_bound(kind: str, x: torch.Tensor, t: BlockTensor) -> torch.Tensor:
    """The most |y - x W^T| may be: each activation rounded to int8 is off by at most half a step
    (1/254 of the largest in its block of 32, or its super-block of 256 for the K-quants), and
    meets all of W (zero terms included: they take the rounded blocks' sums); plus float32 sums."""
    return group_rounding_bound(x, t, 32 if kind in LEGACY else 256)


def group_rounding_bound(x: torch.Tensor, t: BlockTensor, group: int) -> torch.Tensor:
    """rounding_bound for activations rounded per `group` values."""
    top = x.double().abs().view(x.shape[0], -1, group).amax(-1).repeat_interleave(group, dim=1)
    dense = torch.from_numpy(t.dequantize()).double().abs()
    return (top / 254) @ dense.t() + 1e-5 * (x.double().abs() @ dense.t())


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(sorted(KINDS)), rows=st.integers(1, 40), blocks=st.integers(1, 3),
       tokens=st.sampled_from([1, 2, 3, 4, 5, 9, 70]), seed=st.integers(0, 2**16))
def test_block_linear_equals_the_float64_matmul_up_to_activation_rounding(kind, rows, blocks, tokens, seed):
    # legacy rows of 9, 17, 25 blocks: lrow sums eight at a time, then a tail of one
    cols = (8 * blocks + 1) * 32 if kind in LEGACY else blocks * KINDS[kind][1]
    t = random_tensor(kind, rows, cols, seed)
    x = torch.randn(tokens, cols, generator=torch.Generator().manual_seed(seed + 1)) * 3
    x[0, 0] = 40.0   # an outlier activation: rounding is per block, so it coarsens its own block only
    got = KERNELS.block_linear(x, block_matrix([t])).double()
    want = x.double() @ torch.from_numpy(t.dequantize()).double().t()
    assert got.shape == (tokens, rows)
    assert ((got - want).abs() <= rounding_bound(kind, x, t)).all()


@pytest.mark.parametrize("tokens", [1, 3, 70])
def test_stacked_segments_of_mixed_types_equal_their_separate_products(tokens):
    """q, k and v of one projection, as Q4_K_M stores them: Q4_K, a row-mapped Q4_K, Q6_K."""
    q, k, v = random_tensor("Q4_K", 34, 512, 0), random_tensor("Q4_K", 10, 512, 1), random_tensor("Q6_K", 6, 512, 2)
    k = k.reordered(np.array([9, 8, 7, 6, 5, 4, 3, 2, 1, 0]))
    x = torch.randn(tokens, 512, generator=torch.Generator().manual_seed(3))
    stacked = KERNELS.block_linear(x, block_matrix([q, k, v]))
    assert torch.equal(stacked, torch.cat([KERNELS.block_linear(x, block_matrix([p])) for p in (q, k, v)], dim=1))


def test_a_row_map_reads_the_rows_it_names():
    t = random_tensor("Q5_K", 8, 256, 0)
    order = np.array([5, 5, 0, 7])
    copied = BlockTensor("Q5_K", np.ascontiguousarray(t.data[order]), 256)
    x = torch.randn(2, 256, generator=torch.Generator().manual_seed(1))
    assert torch.equal(KERNELS.block_linear(x, block_matrix([t.reordered(order)])),
                       KERNELS.block_linear(x, block_matrix([copied])))


@pytest.mark.parametrize("tokens", [1, 2, 4, 9])
@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0", "Q4_K", "Q6_K"])
def test_a_permuting_row_map_is_read_in_file_order_and_written_where_it_maps(kind, tokens):
    """llama.cpp's q / k permutation: each file row's result lands in the output row the map gives it."""
    t = random_tensor(kind, 40, 512, 0)
    order = np.random.default_rng(2).permutation(40)
    mapped = t.reordered(order)
    assert mapped.out_of is not None and np.array_equal(mapped.row_map[mapped.out_of], np.arange(40))
    copied = BlockTensor(kind, np.ascontiguousarray(t.data[order]), 512)
    bias = torch.randn(40, generator=torch.Generator().manual_seed(4))
    x = torch.randn(tokens, 512, generator=torch.Generator().manual_seed(1))
    assert torch.equal(KERNELS.block_linear(x, block_matrix([mapped], bias)),
                       KERNELS.block_linear(x, block_matrix([copied], bias)))


def test_a_row_map_that_is_no_permutation_has_no_inverse():
    assert random_tensor("Q4_K", 8, 256, 0).reordered(np.array([5, 5, 0, 7])).out_of is None


@pytest.mark.parametrize("tokens", [2, 4, 5, 8, 70])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_row_of_a_batch_equals_its_product_alone(kind, tokens):
    """The batched tiles (one or two weight rows by two or four tokens; from 5 rows, the legacy types'
    and Q4_K / Q5_K's tokens interleaved by eight, 70 of them in pairs of groups and one alone) sum
    each row in the same order as one token does."""
    # K-quants: five super-blocks (krow sums four at a time, then one); legacy: 41 blocks (eight at a time)
    cols = 1280 if kind not in LEGACY else 1312
    t = random_tensor(kind, 21, cols, 0)
    x = torch.randn(tokens, cols, generator=torch.Generator().manual_seed(1))
    batched = KERNELS.block_linear(x, block_matrix([t]))
    assert torch.equal(batched, torch.cat([KERNELS.block_linear(x[i:i + 1], block_matrix([t]))
                                           for i in range(tokens)]))


@pytest.mark.parametrize("kind", ["Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "MXFP4"])
def test_interleaved_rows_read_the_rows_a_row_map_names(kind):
    t = random_tensor(kind, 8, 256, 0)
    order = np.array([5, 5, 0, 7])
    copied = BlockTensor(kind, np.ascontiguousarray(t.data[order]), 256)
    x = torch.randn(9, 256, generator=torch.Generator().manual_seed(1))
    assert torch.equal(KERNELS.block_linear(x, block_matrix([t.reordered(order)])),
                       KERNELS.block_linear(x, block_matrix([copied])))


@pytest.mark.parametrize("tokens", [3, 9])
def test_block_linear_adds_its_bias_as_a_separate_add_after_the_product(tokens):
    t = random_tensor("Q4_1", 40, 64, 0)
    x = torch.randn(tokens, 64, generator=torch.Generator().manual_seed(1))
    bias = torch.randn(40, generator=torch.Generator().manual_seed(2))
    assert torch.equal(KERNELS.block_linear(x, block_matrix([t], bias)), KERNELS.block_linear(x, block_matrix([t])) + bias)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_block_linear_of_zero_activations_is_zero(kind):
    t = random_tensor(kind, 8, 256, 0)
    assert torch.equal(KERNELS.block_linear(torch.zeros(3, 256), block_matrix([t])), torch.zeros(3, 8))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_block_linear_without_avx2_matches_the_vector_path(kind, tmp_path_factory):
    """The portable loops (a CPU without AVX2) compute the same integer dots; only the order of
    float sums differs."""
    portable = _portable(tmp_path_factory)
    t = random_tensor(kind, 37, 512, 1)
    x = torch.randn(6, 512, generator=torch.Generator().manual_seed(2))
    m = block_matrix([t])
    torch.testing.assert_close(portable.block_linear(x, m), KERNELS.block_linear(x, m), rtol=1e-5, atol=1e-5)


_PORTABLE: list = []


def _portable(tmp_path_factory) -> CpuKernels:
    if not _PORTABLE:
        path = tmp_path_factory.mktemp("portable") / "portable.so"
        cpu_kernels.build(path, [*cpu_kernels.FLAGS, "-mno-avx2"])
        _PORTABLE.append(CpuKernels(ctypes.CDLL(str(path))))
    return _PORTABLE[0]


def test_block_linear_of_no_rows_is_empty():
    """A prefill chunk that samples no row asks the LM head for zero rows."""
    t = random_tensor("Q8_0", 64, 64, 0)
    assert KERNELS.block_linear(torch.zeros(0, 64), block_matrix([t])).shape == (0, 64)


# ---- prefill rows: bf16 panels (runtime/models/linear.py's BlockLinear, AMX / AVX512-BF16 CPUs) --------
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_bf16_panel_is_the_dequantised_rows_rounded_to_nearest_even(kind):
    t = random_tensor(kind, 9, 2 * KINDS[kind][1], 4)
    m = block_matrix([t])
    want = torch.from_numpy(t.dequantize()).bfloat16()
    assert torch.equal(KERNELS.dequantize_panel_bf16(m, 2, 7), want[2:7])


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_bf16_panel_of_extreme_scales_is_the_dequantised_rows_rounded_to_nearest_even(kind):
    t = extreme_tensor(kind)
    want = torch.from_numpy(t.dequantize()).bfloat16()
    assert torch.equal(KERNELS.dequantize_panel_bf16(block_matrix([t]), 0, 12).view(torch.int16), want.view(torch.int16))


def test_bf16_panels_span_stacked_segments_and_row_maps():
    q, k, v = random_tensor("Q4_K", 34, 512, 0), random_tensor("Q4_K", 10, 512, 1), random_tensor("Q6_K", 6, 512, 2)
    k = k.reordered(np.array([9, 8, 7, 6, 5, 4, 3, 2, 1, 0]))
    want = torch.cat([torch.from_numpy(p.dequantize()) for p in (q, k, v)]).bfloat16()
    assert torch.equal(KERNELS.dequantize_panel_bf16(block_matrix([q, k, v]), 30, 50), want[30:50])


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_prefill_rows_through_bf16_panels_equal_the_float64_matmul_up_to_bf16_rounding(kind):
    """From BF16_GEMM_ROWS rows, where the platform has a bf16 GEMM: inputs, weights and outputs
    in bf16 (8 significant bits each), float32 sums."""
    from radixserve.runtime.models.linear import BF16_GEMM_ROWS, BlockLinear

    t = random_tensor(kind, 40, 2 * KINDS[kind][1], 5)
    bias = torch.randn(40)
    lin = BlockLinear([t], bias, KERNELS, [("bf16", BF16_GEMM_ROWS)])
    x = torch.randn(2 * BF16_GEMM_ROWS + 3, t.cols, generator=torch.Generator().manual_seed(6))
    got = lin(x).double()
    dense = torch.from_numpy(t.dequantize()).double()
    want = x.double() @ dense.t() + bias.double()
    bound = 3 * 2.0 ** -8 * (x.double().abs() @ dense.abs().t() + want.abs()) + 1e-6
    assert ((got - want).abs() <= bound).all()
    assert not torch.equal(got.float(), KERNELS.block_linear(x, lin.matrix) + bias)   # it took the other path


def test_decode_rows_stay_on_the_block_kernels_where_a_bf16_gemm_exists():
    from radixserve.runtime.models.linear import BF16_GEMM_ROWS, BlockLinear

    t = random_tensor("Q4_1", 16, 64, 7)
    lin = BlockLinear([t], None, KERNELS, [("bf16", BF16_GEMM_ROWS)])
    x = torch.randn(4, 64)
    assert torch.equal(lin(x), KERNELS.block_linear(x, lin.matrix))


# ---- prefill rows: the int8 GEMM (kernels/cpu_kernels.cpp's block_gemm, CPUs with VNNI) ----------------
needs_int8_gemm = pytest.mark.skipif(not KERNELS.int8_gemm, reason="block_gemm needs VNNI (AVX512-VNNI or AVX-VNNI)")


@needs_int8_gemm
@settings(max_examples=40, deadline=None)
@given(kind=st.sampled_from(sorted(KINDS)), rows=st.integers(1, 40), blocks=st.integers(1, 3),
       tokens=st.sampled_from([1, 2, 3, 4, 5, 70]), seed=st.integers(0, 2**16))
def test_block_gemm_equals_the_float64_matmul_up_to_activation_rounding(kind, rows, blocks, tokens, seed):
    """Rows past a multiple of 16 fill a tile with padding; tokens past a multiple of four take a
    narrower register tile."""
    t = random_tensor(kind, rows, 256 * blocks, seed)
    x = torch.randn(tokens, t.cols, generator=torch.Generator().manual_seed(seed + 1)) * 3
    x[0, 0] = 40.0   # an outlier activation coarsens its own 256 only
    got = KERNELS.block_gemm(x, block_matrix([t])).double()
    want = x.double() @ torch.from_numpy(t.dequantize()).double().t()
    assert got.shape == (tokens, rows)
    # block_gemm rounds activations per 256 values, whatever the block type
    assert ((got - want).abs() <= group_rounding_bound(x, t, 256)).all()


@needs_int8_gemm
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_row_of_a_block_gemm_equals_its_product_alone(kind):
    """The same operations in the same order for a token whatever the tile it is in: batch invariant."""
    t = random_tensor(kind, 21, 512, 0)
    x = torch.randn(7, 512, generator=torch.Generator().manual_seed(1))
    batched = KERNELS.block_gemm(x, block_matrix([t]))
    assert torch.equal(batched, torch.cat([KERNELS.block_gemm(x[i:i + 1], block_matrix([t])) for i in range(7)]))


@needs_int8_gemm
def test_block_gemm_of_stacked_segments_and_row_maps_equals_their_separate_products():
    """q, k and v as Q4_K_M stores them (Q4_K, a row-mapped Q4_K, Q6_K), with a bias added after the sum."""
    q, k, v = random_tensor("Q4_K", 34, 512, 0), random_tensor("Q4_K", 10, 512, 1), random_tensor("Q6_K", 6, 512, 2)
    k = k.reordered(np.random.default_rng(3).permutation(10))
    bias = torch.randn(50, generator=torch.Generator().manual_seed(4))
    x = torch.randn(9, 512, generator=torch.Generator().manual_seed(3))
    stacked = KERNELS.block_gemm(x, block_matrix([q, k, v], bias))
    apart = torch.cat([KERNELS.block_gemm(x, block_matrix([p])) for p in (q, k, v)], dim=1)
    assert torch.equal(stacked, apart + bias)


@needs_int8_gemm
def test_prefill_rows_take_the_int8_gemm_and_decode_rows_the_block_kernels():
    from radixserve.runtime.models.linear import INT8_GEMM_ROWS, BlockLinear

    t = random_tensor("Q4_K", 24, 512, 8)
    lin = BlockLinear([t], None, KERNELS, [("int8", INT8_GEMM_ROWS)])
    prefill, decode = torch.randn(INT8_GEMM_ROWS, 512), torch.randn(INT8_GEMM_ROWS - 1, 512)
    assert torch.equal(lin(prefill), KERNELS.block_gemm(prefill, lin.matrix))
    assert torch.equal(lin(decode), KERNELS.block_linear(decode, lin.matrix))


def test_a_matrix_whose_width_is_no_multiple_of_256_takes_the_next_gemm_the_platform_offers():
    from radixserve.runtime.models.linear import BF16_GEMM_ROWS, INT8_GEMM_ROWS, BlockLinear

    t = random_tensor("Q8_0", 24, 288, 8)
    assert BlockLinear([t], None, KERNELS, [("int8", INT8_GEMM_ROWS)]).prefill_gemm is None
    lin = BlockLinear([t], None, KERNELS, [("int8", INT8_GEMM_ROWS), ("bf16", BF16_GEMM_ROWS)])
    x = torch.randn(INT8_GEMM_ROWS, 288)
    assert lin.prefill_gemm == "bf16" and torch.equal(lin(x), lin._bf16_panels(x))
