"""The attention Triton kernels (KV write, split-KV decode, extend) match their plain-torch
references, run under the Triton interpreter on CPU tensors (see triton_attention_check.py)."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernels.triton_attention import num_decode_splits


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_attention_kernels_match_torch_references_under_interpreter():
    script = Path(__file__).with_name("triton_attention_check.py")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def test_decode_splits_fill_the_device_but_never_get_short():
    assert num_decode_splits(batch=1, kv_heads=8, max_len=8192) == 32    # capped
    assert num_decode_splits(batch=32, kv_heads=8, max_len=8192) == 2    # 2 x 132 SMs / 256 programs
    assert num_decode_splits(batch=256, kv_heads=8, max_len=8192) == 1   # the batch fills the device
    assert num_decode_splits(batch=1, kv_heads=8, max_len=300) == 2      # >= 256 tokens per split
    assert num_decode_splits(batch=1, kv_heads=8, max_len=1) == 1
