"""bench/gpu_check.py: its --cpu-smoke mode runs every section on tiny shapes (Triton interpreter,
torch CPU), and without CUDA a plain run refuses in one line."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "gpu_check.py"


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_cpu_smoke_runs_every_section_and_writes_results(tmp_path):
    out = tmp_path / "gpu_check.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--cpu-smoke", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads(out.read_text())
    assert all(r["rel_err"] < 1e-4 for r in results["kernels"])
    assert results["decode_roofline"] and results["prefill"]
    assert all("transformers_tok_s" in r and "cuda_graph_tok_s" in r for r in results["decode_throughput"])


def test_plain_run_without_cuda_refuses_in_one_line():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert len(done.stderr.strip().splitlines()) == 1 and "CUDA" in done.stderr
