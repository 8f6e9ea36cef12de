"""argmax_rows, the sampler's CPU argmax (the CPU kernels' and the torch ops' forms), against
torch.argmax."""
from __future__ import annotations

import pytest
import torch

from radixserve.kernels import cpu_kernels
from radixserve.kernels.sampling import ARGMAX_CHUNK, argmax_rows_torch

FORMS = {"torch": argmax_rows_torch}
if cpu_kernels.load() is not None:
    FORMS["kernels"] = cpu_kernels.load().argmax_rows


@pytest.fixture(params=sorted(FORMS))
def argmax(request):
    return FORMS[request.param]


@pytest.mark.parametrize("width", [49152, 49152 + 37, 3 * ARGMAX_CHUNK - 1, 100])
def test_argmax_rows_equals_torch_argmax_on_random_rows(width, argmax):
    x = torch.randn(16, width, generator=torch.Generator().manual_seed(width))
    assert torch.equal(argmax(x), x.argmax(-1))


@pytest.mark.parametrize("positions", [(5, 4 * ARGMAX_CHUNK + 2), (ARGMAX_CHUNK - 1, ARGMAX_CHUNK),
                                       (7, 6 * ARGMAX_CHUNK + 3)], ids=["two-chunks", "chunk-edge", "body-and-tail"])
def test_argmax_rows_returns_the_first_of_tied_maxima(positions, argmax):
    x = torch.zeros(2, 6 * ARGMAX_CHUNK + 10)
    x[:, list(positions)] = 3.0
    assert argmax(x).tolist() == [positions[0]] * 2 == x.argmax(-1).tolist()


def test_argmax_rows_finds_a_maximum_in_the_tail(argmax):
    x = torch.zeros(3, 4 * ARGMAX_CHUNK + 9)
    x[0, -1] = 1.0
    x[1, 5] = float("-inf")
    x[2] = float("-inf")
    x[2, 4 * ARGMAX_CHUNK + 3] = -1.0
    assert argmax(x).tolist() == x.argmax(-1).tolist() == [4 * ARGMAX_CHUNK + 8, 0, 4 * ARGMAX_CHUNK + 3]


def test_argmax_rows_reads_a_sliced_padded_vocabulary(argmax):
    padded = torch.randn(4, 5 * ARGMAX_CHUNK + 64)
    padded[:, 5 * ARGMAX_CHUNK:] = 100.0        # padding ids past the tokenizer's vocabulary
    x = padded[:, : 5 * ARGMAX_CHUNK - 3]
    assert torch.equal(argmax(x), x.argmax(-1))


def test_argmax_rows_returns_the_first_nan_as_torch_does(argmax):
    x = torch.randn(3, 3 * ARGMAX_CHUNK + 5, generator=torch.Generator().manual_seed(1))
    x[0, [7, 2 * ARGMAX_CHUNK + 1]] = float("nan")
    x[1, -1] = float("nan")
    x[2, 40] = float("inf")
    assert argmax(x).tolist() == x.argmax(-1).tolist() == [7, 3 * ARGMAX_CHUNK + 4, 40]
