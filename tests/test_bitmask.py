"""Token-bitmask apply: both CPU paths (eager torch, the C++ kernel) and the Triton kernel
against the reference."""
from __future__ import annotations

import pytest
import torch

import radixserve.kernels.cpu_kernels as cpu_kernels
from radixserve.kernels.bitmask import (apply_token_bitmask_, apply_token_bitmask_native, apply_token_bitmask_reference,
                                        apply_token_bitmask_torch, pack_bitmask)
from .triton_interpreter import needs_triton, run_check_under_interpreter

NEG_INF = float("-inf")


@pytest.fixture(params=[apply_token_bitmask_torch, apply_token_bitmask_native], ids=["eager", "native"])
def cpu_path(request):
    return request.param


def random_case(rows: int, vocab: int, density: float, seed: int, words: int | None = None,
                dtype: torch.dtype = torch.float32):
    gen = torch.Generator().manual_seed(seed)
    words = words or (vocab + 31) // 32
    allowed = torch.rand(rows, words * 32, generator=gen) < density
    return torch.randn(rows, vocab, generator=gen).to(dtype), pack_bitmask(allowed)


def test_bit_j_of_word_w_allows_token_w_times_32_plus_j():
    logits = torch.zeros(1, 70)
    bitmask = torch.zeros(1, 3, dtype=torch.int32)
    bitmask[0, 0] = 1 << 5
    bitmask[0, 1] = -2**31  # bit 31 of word 1: token 63
    bitmask[0, 2] = 1 << 3  # token 67
    apply_token_bitmask_reference(logits, bitmask)
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [5, 63, 67]


@pytest.mark.parametrize("vocab", [1, 31, 32, 33, 1000, 4096])
@pytest.mark.parametrize("density", [0.005, 0.5, 0.995])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cpu_path_matches_reference(vocab, density, dtype, cpu_path):
    logits, bitmask = random_case(6, vocab, density, seed=vocab, dtype=dtype)
    expected, got = logits.clone(), logits.clone()
    apply_token_bitmask_reference(expected, bitmask)
    cpu_path(got, bitmask)
    assert torch.equal(expected, got)


def test_cpu_path_matches_reference_on_grammar_like_rows(cpu_path):
    # whole words allowed or disallowed, a few partly allowed ones: the path the engine mostly sees
    allowed = torch.zeros(4, 4096, dtype=torch.bool)
    allowed[0, [3, 700, 701]] = True
    allowed[1] = True
    allowed[1, [5, 64, 65, 4000]] = False
    allowed[2, 1024:2048] = True
    logits = torch.randn(4, 4096)
    expected, got = logits.clone(), logits.clone()
    apply_token_bitmask_reference(expected, pack_bitmask(allowed))
    cpu_path(got, pack_bitmask(allowed))
    assert torch.equal(expected, got)
    assert torch.equal(torch.isfinite(got), allowed)


@pytest.mark.parametrize("as_tensor", [True, False], ids=["index-tensor", "list"])
@pytest.mark.parametrize("vocab", [1000, 1024])  # rows not whole words apart, and flat rows
@pytest.mark.parametrize("rows", [[1, 2, 3], [4, 0], [2], []])
def test_only_listed_rows_are_masked(rows, vocab, as_tensor, cpu_path):
    logits, bitmask = random_case(5, vocab, 0.3, seed=1)
    index = torch.tensor(rows, dtype=torch.long) if as_tensor else rows
    expected, got = logits.clone(), logits.clone()
    apply_token_bitmask_reference(expected, bitmask, torch.tensor(rows, dtype=torch.long))
    cpu_path(got, bitmask, index)
    assert torch.equal(expected, got)
    untouched = [r for r in range(5) if r not in rows]
    assert torch.equal(got[untouched], logits[untouched])


def test_logits_beyond_bitmask_coverage_are_masked(cpu_path):
    logits = torch.randn(2, 100)  # the model's vocab is wider than the grammar's bitmask
    bitmask = torch.full((2, 2), -1, dtype=torch.int32)  # covers tokens 0..63, all allowed
    cpu_path(logits, bitmask)
    assert torch.isfinite(logits[:, :64]).all() and torch.isneginf(logits[:, 64:]).all()


@pytest.mark.parametrize("vocab_size", [990, 960, 1])
def test_columns_at_or_beyond_vocab_size_are_masked(vocab_size, cpu_path):
    logits, bitmask = random_case(3, 1000, 0.995, seed=2)
    expected, got = logits.clone(), logits.clone()
    apply_token_bitmask_reference(expected, bitmask, vocab_size=vocab_size)
    cpu_path(got, bitmask, vocab_size=vocab_size)
    assert torch.equal(expected, got)
    assert torch.isneginf(got[:, vocab_size:]).all()


def test_padded_bitmask_wider_than_logits_ignores_extra_words(cpu_path):
    logits, bitmask = random_case(3, 1000, 0.5, seed=3, words=40)
    expected, got = logits.clone(), logits.clone()
    apply_token_bitmask_reference(expected, bitmask)
    cpu_path(got, bitmask)
    assert torch.equal(expected, got)


def test_disallowed_positive_infinity_becomes_negative_infinity(cpu_path):
    logits = torch.full((1, 64), float("inf"))
    bitmask = torch.tensor([[1, 0]], dtype=torch.int32)
    cpu_path(logits, bitmask)
    assert logits[0, 0] == float("inf") and torch.isneginf(logits[0, 1:]).all()


def test_dispatch_on_cpu_matches_reference():
    logits, bitmask = random_case(2, 500, 0.5, seed=4)
    expected, got = logits.clone(), logits.clone()
    apply_token_bitmask_reference(expected, bitmask)
    apply_token_bitmask_(got, bitmask)
    assert torch.equal(expected, got)


def test_native_path_keeps_an_allowed_nan_and_masks_a_disallowed_one():
    logits = torch.full((1, 64), float("nan"))
    bitmask = torch.tensor([[0x0000FFFF, 0]], dtype=torch.int32)
    apply_token_bitmask_native(logits, bitmask)
    assert torch.isnan(logits[0, :16]).all() and torch.isneginf(logits[0, 16:]).all()


def test_a_row_listed_twice_is_masked_as_once(cpu_path):
    logits, bitmask = random_case(3, 96, 0.5, seed=6)
    expected, got = logits.clone(), logits.clone()
    apply_token_bitmask_reference(expected, bitmask, [1])
    cpu_path(got, bitmask, [1, 1])
    assert torch.equal(expected, got)


def test_native_path_refuses_a_row_beyond_the_logits():
    logits, bitmask = random_case(2, 64, 0.5, seed=7, words=2)
    with pytest.raises(IndexError):
        apply_token_bitmask_native(logits, torch.cat([bitmask, bitmask]), [3])


def test_native_kernel_is_built_here():
    # the machine that runs the tests has a C++ compiler: the fast path must not silently fall back
    assert cpu_kernels.load() is not None


def test_native_path_falls_back_to_eager_without_the_cpu_kernels(monkeypatch):
    monkeypatch.setattr(cpu_kernels, "load", lambda: None)   # as where no C++ compiler works
    logits, bitmask = random_case(3, 1024, 0.3, seed=5)
    expected, got = logits.clone(), logits.clone()
    apply_token_bitmask_reference(expected, bitmask)
    apply_token_bitmask_native(got, bitmask)
    assert torch.equal(expected, got)


@needs_triton
def test_triton_kernel_matches_reference_under_interpreter():
    run_check_under_interpreter("triton_bitmask_check.py")
