"""A `radixserve serve` subprocess on a free loopback port, for the bench scripts that measure the
server from outside: one copy of start, wait for /health, and stop."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalServer:
    """Started by the constructor, healthy when it returns; its stderr goes to a temporary file
    (not a pipe: a full pipe would block the server) that `log()` reads back."""

    def __init__(self, *flags: str, port: int = 0, timeout: float = 300.0):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "radixserve.api.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port),
             "--log-level", "warning", *flags],
            stdout=subprocess.DEVNULL, stderr=self._log, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"radixserve serve did not come up: {self.log()[-2000:]}")
            time.sleep(0.3)

    def log(self) -> str:
        self._log.seek(0)
        return self._log.read()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> "LocalServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
