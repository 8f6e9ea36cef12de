"""Run a check script in a subprocess under the Triton interpreter: triton reads TRITON_INTERPRET
when kernels are decorated (at import), so it cannot be switched on inside the test process."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")


def run_check_under_interpreter(script_name: str) -> None:
    """Run tests/<script_name>; fails the test with the script's output if it exits non-zero."""
    script = Path(__file__).with_name(script_name)
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
