"""A real uvicorn server in a background thread on a free loopback port, for the API tests."""
from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import dataclass
from typing import Iterator, Optional

import httpx
import openai
import uvicorn
from fastapi import FastAPI

from radixserve.api.server import build_app
from radixserve.api.state import ServerState
from radixserve.runtime.config import EngineConfig
from radixserve.runtime.engine import Engine
from radixserve.runtime.models.loader import ModelFiles

# dtype auto (bf16 on CPUs with AMX / AVX512-BF16, as users get it): the API tests ran in 32 s
# against 44 s with float32 on the 2-core dev machine.
TEST_ENGINE_CONFIG = dict(dtype="auto", kv_cache_tokens=8192, max_running_requests=32, max_waiting_requests=8)
SERVED_MODEL = "smollm2-test"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve_app(app: FastAPI) -> Iterator[str]:
    """Run `app` on a free loopback port until the block ends; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@dataclass
class APIServer:
    url: str              # http://127.0.0.1:PORT
    engine: Engine
    state: ServerState    # what the handlers read (a test may switch the tool-call format)
    model: str = SERVED_MODEL

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def client(self, **kw) -> openai.OpenAI:
        """The official client; no retries, so a 503 or a dropped stream shows as what it is."""
        return openai.OpenAI(base_url=self.base_url, api_key="unused", max_retries=0, timeout=120, **kw)

    def async_client(self, **kw) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.base_url, api_key="unused", max_retries=0, timeout=120, **kw)

    def metric(self, name: str, labels: Optional[str] = None) -> float:
        """One sample of /metrics (`labels` like 'finish_reason="stop"'), 0 if absent."""
        text = httpx.get(self.url + "/metrics", timeout=10).text
        key = f"{name}{{{labels}}}" if labels else name
        for line in text.splitlines():
            if line.startswith(key + " "):
                return float(line.split()[-1])
        return 0.0

    def wait_idle(self, timeout: float = 30.0) -> None:
        """Until no request runs or waits (aborts land within one engine step)."""
        deadline = time.monotonic() + timeout
        while True:
            stats = self.engine.stats()
            if stats.num_running == 0 and stats.num_waiting == 0:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"requests still in flight after {timeout} s: {stats}")
            time.sleep(0.05)

    def check_pages(self) -> None:
        """The page invariant: every page is free or owned by the tree once nothing runs."""
        self.wait_idle()
        self.engine.check_idle_invariant()


@contextlib.contextmanager
def running_server(model_files: ModelFiles) -> Iterator[APIServer]:
    """The engine on the default model behind the app, for a whole test session."""
    engine = Engine(EngineConfig(**TEST_ENGINE_CONFIG), model_files=model_files)
    try:
        app = build_app(engine, served_model_name=SERVED_MODEL)
        with serve_app(app) as url:
            yield APIServer(url, engine, app.state.server)
        engine.check_idle_invariant()
        engine.flush_cache()
        assert engine.pool.num_free == engine.pool.num_pages, "KV pages leaked"
    finally:
        engine.shutdown()
