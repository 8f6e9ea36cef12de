"""bench/gpu_check.py: its --cpu-smoke mode runs the kernel sections on tiny shapes (Triton
interpreter, torch CPU), its engine section runs CPU-vs-CPU with --device cpu, and without CUDA a
plain run refuses in one line."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "gpu_check.py"
ENGINE_CHECKS = ["greedy fp32 batch == cpu", "seeded sample repeats", "seeded sample alone == in batch",
                 "logprobs finite, <= 0, top sorted", "seeded sample vs cpu (figure)", "json_schema outputs validate",
                 "json_schema greedy == cpu", "prefix hit: cached_tokens > 0, greedy == cpu",
                 "chunked prefill (64) == whole == cpu", "cuda graphs == eager (greedy batch)",
                 "server: chat completion", "server: streamed chat", "server: json_schema response_format"]


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_cpu_smoke_runs_every_kernel_section_and_writes_results(tmp_path):
    out = tmp_path / "gpu_check.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--cpu-smoke", "--sections", "kernels,roofline,throughput",
                           "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads(out.read_text())
    assert all(r["rel_err"] < 1e-4 for r in results["kernels"])
    assert results["decode_roofline"] and results["prefill"]
    assert all("transformers_tok_s" in r and "cuda_graph_tok_s" in r for r in results["decode_throughput"])
    assert results["all_passed"] and results["checks"]


def test_engine_section_passes_cpu_against_cpu(tmp_path):
    """The same comparison code a CUDA run uses, with the CPU as the device under test: every check
    runs and passes (the reference engine differs in page size and radix cache), figures are taken."""
    out = tmp_path / "gpu_check.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, env=os.environ | {"HF_HUB_OFFLINE": "1"})
    results = json.loads(out.read_text())
    failed = [c for c in results["checks"] if not c["ok"]]
    assert done.returncode == 0 and not failed, json.dumps(failed, indent=1) + done.stdout[-3000:] + done.stderr[-3000:]
    assert results["all_passed"] and results["sections"] == ["engine"]
    assert [c["check"] for c in results["engine"]["checks"]] == ENGINE_CHECKS
    assert results["engine"]["figures"]["throughput_float32"]["decode_tok_s_batch2"] > 0


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class FakeEngine:
    """Answers tie_margin's one-token request with fixed top logprobs."""

    def __init__(self, top):
        self.top = top

    def generate(self, prompt, params):
        lp = SimpleNamespace(top=self.top)
        return [SimpleNamespace(logprobs=[lp], token_ids=[self.top[0][0]])]


def test_greedy_comparison_tolerates_only_near_ties():
    """The branch a CPU-vs-CPU run never reaches: a divergence passes at a near tie, fails at a
    clear margin, and fails when more than half the prompts diverge."""
    gc = load_script()
    tied, clear = FakeEngine([(7, -1.000), (9, -1.005)]), FakeEngine([(7, -0.5), (9, -3.0)])
    want, got = [[1, 7, 3], [4, 5, 6]], [[1, 9, 8], [4, 5, 6]]
    ok, detail = gc.compare_greedy(got, want, [[0], [0]], tied)
    assert ok and detail["differences"][0]["first_difference"] == 1
    assert abs(detail["differences"][0]["margin_nats"] - 0.005) < 1e-9
    assert not gc.compare_greedy(got, want, [[0], [0]], clear)[0]
    assert not gc.compare_greedy(got, want, [[0], [0]], FakeEngine([(7, -0.1), (2, -5.0)]))[0]  # 9 not in top
    many = [[1, 9, 8]] * 4
    assert not gc.compare_greedy(many, [[1, 7, 3]] * 4, [[0]] * 4, tied)[0]
    assert gc.compare_greedy(want, want, [[0], [0]], clear) == (True, {"exact": "2/2", "differences": []})


def test_graph_detection_reports_unknown_rather_than_crashing():
    gc = load_script()
    captured = SimpleNamespace(runner=SimpleNamespace(graphs=SimpleNamespace(graphs={1: object()}, run=lambda c: 1)))
    assert gc.graphs_captured(captured) is True
    assert gc.graphs_captured(SimpleNamespace(runner=SimpleNamespace(graphs=None))) is False
    assert gc.graphs_captured(SimpleNamespace(runner=SimpleNamespace())) == "unknown"
    assert gc.graphs_captured(SimpleNamespace()) == "unknown"
    served = gc.count_replays(captured)
    captured.runner.graphs.run([[1]])
    assert served == [1]


def test_plain_run_without_cuda_refuses_in_one_line():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert len(done.stderr.strip().splitlines()) == 1 and "CUDA" in done.stderr
