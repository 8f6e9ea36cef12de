"""radixserve: an LLM serving runtime. The Python API:

    from radixserve import Engine, EngineConfig, SamplingParams, GrammarSpec

This file is the package root: setuptools maps `radixserve` to the repository root, so each
top-level folder installs as `radixserve.<folder>` and nothing else lands at top level. Names load
on first use, so `import radixserve.radix` does not pull in the engine.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

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
