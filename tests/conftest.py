"""Shared fixtures: the real default model is read once per session; every engine a test builds is
checked for the KV page invariant and drained of cached pages when the test ends."""
from __future__ import annotations

import gc
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from radixserve.runtime.config import EngineConfig  # noqa: E402
from radixserve.runtime.engine import Engine  # noqa: E402
from radixserve.runtime.models.loader import load_model_files  # noqa: E402


@pytest.fixture(scope="session")
def default_model_files():
    return load_model_files(None)


@pytest.fixture(scope="session")
def default_tokenizer(default_model_files):
    return default_model_files.tokenizer


def assert_all_pages_free(engine: Engine) -> None:
    engine.check_idle_invariant()
    engine.flush_cache()
    assert engine.pool.num_free == engine.pool.num_pages, "KV pages leaked"
    if engine.windows is not None:
        assert engine.windows.num_free == engine.windows.num_pages, "window pages leaked"


@pytest.fixture
def make_engine(default_model_files):
    """Build engines on the default model (float32 unless asked otherwise); checked and shut down after."""
    engines: list[Engine] = []

    def build(files=None, **overrides) -> Engine:
        cfg = dict(dtype="float32", kv_cache_tokens=8192, max_running_requests=16)
        cfg.update(overrides)
        engine = Engine(EngineConfig(**cfg), model_files=files or default_model_files)
        engines.append(engine)
        return engine

    yield build
    for engine in engines:
        try:
            assert_all_pages_free(engine)
        finally:
            engine.shutdown()
    # an engine is a graph of cycles (threads, backends): without a collection its weights and KV
    # pool (~1 GB at float32) outlive the test, and a worker running many such tests runs out of memory
    engines.clear()
    gc.collect()


@pytest.fixture(scope="session")
def api_server(default_model_files):
    """The OpenAI-compatible server (real uvicorn, default model) shared by tests/test_api_*.py."""
    from .api_server import running_server

    with running_server(default_model_files) as server:
        yield server


@pytest.fixture
def api(api_server):
    """The shared server; after the test, nothing is left running and the page invariant holds."""
    yield api_server
    api_server.check_pages()
