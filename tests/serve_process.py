"""`radixserve serve` as a real child process on loopback, for tests of what only a process shows:
signals, exit codes, restarts."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import httpx

from .api_server import free_port

FAULTY_SERVE = Path(__file__).with_name("faulty_serve.py")


class Server:
    def __init__(self, *flags: str, fault: Optional[str] = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [str(FAULTY_SERVE), fault] if fault else ["-m", "radixserve.api.cli"]
        self.proc = subprocess.Popen(
            [sys.executable, *command, "serve", "--port", str(self.port), "--kv-cache-tokens", "8192",
             "--dtype", "float32", "--served-model-name", "smol", "--log-level", "info", *flags],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        deadline = time.monotonic() + 120
        while True:
            assert self.proc.poll() is None, self.proc.communicate()
            assert time.monotonic() < deadline, "the server did not become healthy"
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)

    def wait(self, timeout: float) -> tuple[int, str]:
        """Exit status and stderr (the log)."""
        _, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, err

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()
