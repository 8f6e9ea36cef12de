"""The attention Triton kernels (KV write, split-KV decode, extend) match their plain-torch
references, and the engine on the Triton backend generates what it does on the torch backend; both
run under the Triton interpreter on CPU tensors in a subprocess (see triton_*_check.py)."""
from __future__ import annotations

import pytest
import torch

from radixserve.kernels.triton_attention import num_decode_splits
from radixserve.runtime.attention import make_attention_backend, resolve_attention_backend
from radixserve.runtime.attention_cpu import KernelDecodes
from radixserve.runtime.platform import get_platform
from radixserve.runtime.config import EngineConfig
from radixserve.runtime.kv_cache import KVCache
from .triton_interpreter import needs_triton, run_check_under_interpreter


@needs_triton
def test_attention_kernels_match_torch_references_under_interpreter():
    run_check_under_interpreter("triton_attention_check.py")


def test_decode_splits_fill_the_device_but_never_get_short():
    assert num_decode_splits(batch=1, kv_heads=8, max_len=8192) == 32    # capped
    assert num_decode_splits(batch=32, kv_heads=8, max_len=8192) == 2    # 2 x 132 SMs / 256 programs
    assert num_decode_splits(batch=256, kv_heads=8, max_len=8192) == 1   # the batch fills the device
    assert num_decode_splits(batch=1, kv_heads=8, max_len=300) == 2      # >= 256 tokens per split
    assert num_decode_splits(batch=1, kv_heads=8, max_len=1) == 1


@needs_triton
def test_engine_greedy_output_with_triton_backend_equals_torch_backend_under_interpreter():
    run_check_under_interpreter("triton_engine_check.py")


def test_auto_backend_is_the_cpu_kernels_on_cpu_and_triton_on_cuda():
    cpu, cuda = get_platform(torch.device("cpu")), get_platform(torch.device("cuda"))
    assert resolve_attention_backend("auto", cpu) == "cpu"
    assert resolve_attention_backend("auto", cuda) == "triton"
    assert resolve_attention_backend("torch", cuda) == "torch"


def test_sliding_windows_and_sinks_run_on_each_platforms_own_kernels():
    cpu, cuda = get_platform(torch.device("cpu")), get_platform(torch.device("cuda"))
    assert resolve_attention_backend("auto", cuda, window=512) == "triton"
    assert resolve_attention_backend("auto", cuda, sinks=True) == "triton"
    assert resolve_attention_backend("auto", cpu, window=512, sinks=True) == "cpu"


def test_triton_backend_refuses_cpu_tensors_outside_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    kv = KVCache(1, 2, 16, 1, 16, torch.float32, torch.device("cpu"))
    table = torch.zeros(1, 2, dtype=torch.long)
    with pytest.raises(ValueError, match="CUDA"):
        make_attention_backend("triton", kv, table, 1, get_platform(torch.device("cpu")))
    assert isinstance(make_attention_backend("auto", kv, table, 1, get_platform(torch.device("cpu"))).decodes,
                      KernelDecodes)


def test_config_accepts_triton_backend_and_rejects_unknown():
    EngineConfig(attention_backend="triton").validate()
    with pytest.raises(ValueError, match="attention-backend"):
        EngineConfig(attention_backend="flash").validate()
