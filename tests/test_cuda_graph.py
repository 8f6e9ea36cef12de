"""The device-independent part of decode CUDA graphs: which batch sizes are captured and which
one a batch is padded to. (Replaying padded static batches is checked eagerly, under the Triton
interpreter, by triton_engine_check.py; the capture itself needs CUDA: bench/gpu_check.py.)"""
from __future__ import annotations

import pytest

from radixserve.runtime.cuda_graph import capture_sizes, padded_size


def test_ladder_is_powers_of_two_to_8_then_multiples_of_16_then_the_limit():
    assert capture_sizes(64) == [1, 2, 4, 8, 16, 32, 48, 64]
    assert capture_sizes(100) == [1, 2, 4, 8, 16, 32, 48, 64, 80, 96, 100]


@pytest.mark.parametrize("limit", [1, 3, 8, 16, 17])
def test_small_limits_end_at_the_limit(limit):
    sizes = capture_sizes(limit)
    assert sizes[-1] == limit and sizes == sorted(set(sizes)) and all(1 <= s <= limit for s in sizes)


@pytest.mark.parametrize("n,padded", [(1, 1), (3, 4), (8, 8), (9, 16), (17, 32), (97, 100), (100, 100)])
def test_batch_pads_to_the_next_captured_size(n, padded):
    assert padded_size(n, capture_sizes(100)) == padded


def test_batch_beyond_the_ladder_runs_eagerly():
    assert padded_size(101, capture_sizes(100)) is None


def test_every_batch_up_to_the_limit_wastes_under_16_rows():
    sizes = capture_sizes(256)
    assert all(0 <= padded_size(n, sizes) - n < 16 for n in range(1, 257))
