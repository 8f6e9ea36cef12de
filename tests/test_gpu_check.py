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
ENGINE_CHECKS = ["greedy fp32 batch == cpu", "top-20 logprobs along equal prefixes == cpu", "seeded sample repeats", "seeded sample alone == in batch",
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


def test_engine_section_passes_cpu_against_cpu_on_the_gpu_bundles_model(tmp_path):
    """What bench/gpu_run.sh runs on a GPU, with the CPU as the device under test: the default
    model's skeleton (config and tokenizer, as `make gpu-bundle` writes it) with random weights.
    Every check runs and passes (the reference engine differs in page size and radix cache), the
    greedy text is not degenerate, figures are taken."""
    model = tmp_path / "model"
    load_bundle_script().write_model_skeleton(model)
    out = tmp_path / "gpu_check.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--sections", "engine", "--model", str(model),
                           "--random-weights", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, env=os.environ | {"HF_HUB_OFFLINE": "1"})
    results = json.loads(out.read_text())
    failed = [c for c in results["checks"] if not c["ok"]]
    assert done.returncode == 0 and not failed, json.dumps(failed, indent=1) + done.stdout[-3000:] + done.stderr[-3000:]
    assert results["all_passed"] and results["complete"] and results["sections"] == ["engine"]
    assert [c["check"] for c in results["engine"]["checks"]] == ENGINE_CHECKS
    assert results["engine"]["random_weights"] and results["engine"]["model"] == "model"
    figures = results["engine"]["figures"]["throughput_float32"]
    assert figures["decode_tok_s_batch2"] > 0 and figures["decode_vs_transformers_batch2"] > 0


def load_script(path: Path = SCRIPT, name: str = "gpu_check_under_test"):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_bundle_script():
    return load_script(SCRIPT.with_name("gpu_bundle.py"), "gpu_bundle_under_test")


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


def test_random_weights_at_small_scale_count_as_degenerate():
    gc = load_script()
    assert gc.degenerate([[30685] * 11 + [36739], [36739] * 12])   # std 0.02 on the default model's shape
    assert gc.degenerate([[1, 2, 3], [1, 2, 3]])                     # every prompt continued alike
    assert not gc.degenerate([[1, 2, 3], [4, 5, 6]])


def test_logprob_deltas_compare_up_to_the_first_different_token():
    gc = load_script()
    lp = lambda *top: SimpleNamespace(top=list(top))  # noqa: E731
    want = SimpleNamespace(token_ids=[1, 2, 3], logprobs=[lp((1, -0.1), (5, -2.0)), lp((2, -0.2)), lp((3, -0.3))])
    got = SimpleNamespace(token_ids=[1, 4, 9], logprobs=[lp((1, -0.1001), (6, -2.5)), lp((4, -0.19), (2, -0.25)),
                                                         lp((9, -9.0))])
    worst, positions, fewest = gc.logprob_deltas(got, want)
    # positions 0 and 1 share their context; position 2 follows different tokens and is not compared
    assert positions == 2 and fewest == 1 and abs(worst - 0.05) < 1e-9


def test_model_skeleton_has_the_default_models_shape_and_tokenizer(tmp_path):
    from radixserve.runtime.models.loader import load_model_files

    load_bundle_script().write_model_skeleton(tmp_path)
    skeleton, default = load_model_files(str(tmp_path), weights=False), load_model_files(None, weights=False)
    assert vars(skeleton.config) == vars(default.config)
    text = "Paris est la capitale de la France. <|im_start|>"
    assert skeleton.tokenizer.encode(text) == default.tokenizer.encode(text)
    chat = [{"role": "user", "content": "hi"}]
    assert skeleton.tokenizer.apply_chat_template(chat) == default.tokenizer.apply_chat_template(chat)
    assert sum(f.stat().st_size for f in tmp_path.iterdir()) < 4 << 20


def fake_wheel(directory: Path, name: str, version: str, requires: list[str]) -> Path:
    """A wheel file as far as the closure check reads one: its name and its METADATA."""
    import zipfile

    path = directory / f"{name}-{version}-py3-none-any.whl"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}-{version}.dist-info/METADATA", meta)
    return path


def test_bundle_closure_needs_every_requirement_pinned_or_on_the_image(tmp_path):
    gb = load_bundle_script()
    wheels = [fake_wheel(tmp_path, "app", "1.0", ["lib>=2", "torch>=2.0", "extra-only; extra == 'x'",
                                                  "win-only; sys_platform == 'win32'"]),
              fake_wheel(tmp_path, "lib", "2.1", [])]
    assert gb.closure_problems(wheels, {"app": "1.0", "lib": "2.1"}) == []
    assert gb.closure_problems(wheels[:1], {"app": "1.0"}) == ["app needs lib>=2: neither pinned nor on the image"]
    assert gb.closure_problems(wheels, {"app": "1.0", "lib": "1.9"}) == ["lib: pinned 1.9, wheel 2.1",
                                                                         "app needs lib>=2, pinned 1.9"]


def test_bundle_closure_pins_what_the_image_may_have_too_old(tmp_path):
    gb = load_bundle_script()
    wheels = [fake_wheel(tmp_path, "app", "1.0", ["torch>=2.12", "regex>=2024.1", "numpy"])]
    problems = gb.closure_problems(wheels, {"app": "1.0"})
    assert problems == ["app needs torch>=2.12: the image may have 2.11",
                        "app needs regex>=2024.1: the image's version is unknown; pin it"]


def test_bundle_pins_every_package_the_image_lacks_exactly():
    gb = load_bundle_script()
    pins = gb.read_pins()   # raises on anything but name==version
    assert {"xgrammar", "apache-tvm-ffi", "fastapi", "starlette", "openai", "httpx2", "jsonschema", "pydantic",
            "uvicorn", "sse-starlette", "gguf"} <= pins.keys()
    assert not pins.keys() & {"torch", "triton", "transformers", "numpy"}   # the image's own: never shadowed
