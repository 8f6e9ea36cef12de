"""`radixserve serve`: listens while the model loads (/health 503), then serves and says what and where."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx

from .api_server import free_port


def test_serve_reports_loading_then_answers_and_prints_what_it_serves():
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RADIXSERVE_API_KEY": "k"}
    proc = subprocess.Popen([sys.executable, "-m", "radixserve.api.cli", "serve", "--port", str(port), "--kv-cache-tokens",
                             "2048", "--dtype", "float32", "--served-model-name", "smol", "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        statuses = []
        deadline = time.monotonic() + 120
        while not statuses or statuses[-1] != 200:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else ""
            try:
                statuses.append(httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code)
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        assert set(statuses) <= {503, 200}
        r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=120,
                       headers={"Authorization": "Bearer k"},
                       json={"model": "smol", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
        assert r.status_code == 200, r.text
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=30)
        assert models.status_code == 401  # the key came from the environment
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    for needle in ("SmolLM2-135M-Instruct", "'smol'", "cpu (float32)", "KV cache 2048 tokens",
                   f"http://127.0.0.1:{port}/v1"):
        assert needle in out, out
