"""radixserve: an LLM serving runtime. The Python API:

    from radixserve import Engine, EngineConfig, SamplingParams, GrammarSpec

This file is the package root: setuptools maps `radixserve` to the repository root, so each
top-level folder installs as `radixserve.<folder>` and nothing else lands at top level. Names load
on first use, so `import radixserve.radix` does not pull in the engine.
"""
from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING

# A CPU prefill's activations are tensors of tens to hundreds of MB (a 1B model's gate-up at 2,048
# tokens: 134 MB), each a fresh mapping whose 4 KB pages fault in one by one. PyTorch backs large
# tensors with huge pages when this is set before its first allocation (bench/gemm.py --prefill,
# with THP_MEM_ALLOC_ENABLE=0 against the default)
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

_EXPORTS = {
    "Engine": "radixserve.runtime.engine",
    "EngineConfig": "radixserve.runtime.config",
    "SamplingParams": "radixserve.runtime.sampling_params",
    "GrammarSpec": "radixserve.grammar.spec",
}
__all__ = list(_EXPORTS)

if TYPE_CHECKING:
    from radixserve.grammar.spec import GrammarSpec
    from radixserve.runtime.config import EngineConfig
    from radixserve.runtime.engine import Engine
    from radixserve.runtime.sampling_params import SamplingParams


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'radixserve' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
