"""The `radixserve` command: streaming generation and one-line errors."""
import os
import subprocess
import sys

import pytest

CLI = [sys.executable, "-m", "radixserve.api.cli"]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}


def run(*args, timeout=120):
    return subprocess.run(CLI + list(args), capture_output=True, text=True, timeout=timeout, env=ENV)


def test_generate_streams_the_reply_to_stdout():
    r = run("generate", "--chat", "What is the capital of France? Answer in one sentence.", "--max-tokens", "24",
            "--kv-cache-tokens", "4096")
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout


@pytest.mark.parametrize("args,needle", [
    (["--model", "/nonexistent/model.gguf"], "does not exist"),
    (["--model", "__file__"], "not a readable GGUF"),
    (["--max-tokens", "0"], "max_tokens"),
])
def test_bad_input_gives_one_error_line_without_traceback(args, needle, tmp_path):
    if "__file__" in args:
        bad = tmp_path / "corrupt.gguf"
        bad.write_bytes(b"this is not a gguf file")
        args = [str(bad) if a == "__file__" else a for a in args]
    r = run("generate", "hello", "--kv-cache-tokens", "1024", *args)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    errors = [line for line in r.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and needle in errors[0]


def test_unsupported_architecture_is_named(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}')
    r = run("generate", "hello", "--model", str(tmp_path))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "unsupported architecture 'GPT2LMHeadModel'" in r.stderr
