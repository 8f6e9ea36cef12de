"""README.md is a specification too: its commands run against a live server here, so they cannot rot.

Only what a test cannot run quickly is left to `make` (`make serve`, `make test`, `make bench`):
the tests check those targets exist and do what the README says they do.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import httpx

from radixserve.api.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
DEFAULT_URL = "http://127.0.0.1:8000"


def code_blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def sh_commands() -> list[str]:
    """Every shell command in the README: comments stripped, continuation lines and quoted
    multi-line arguments joined."""
    commands = []
    for block in code_blocks("sh"):
        pending = ""
        for line in re.sub(r"\\\n", " ", block).split("\n"):
            pending = f"{pending}\n{line}" if pending else line
            if pending.count("'") % 2:  # inside a quoted argument
                continue
            cmd = re.sub(r"\s+#.*$", "", pending).strip()
            pending = ""
            if cmd and not cmd.startswith("#"):
                commands.append(cmd)
    return commands


def block_containing(lang: str, text: str) -> str:
    (block,) = [b for b in code_blocks(lang) if text in b]
    return block


def make_targets() -> set[str]:
    return set(re.findall(r"^([a-z-]+):", (ROOT / "Makefile").read_text(), flags=re.M))


def test_readme_starts_with_make_serve_and_make_test():
    first = code_blocks("sh")[0]
    assert [line.split("#")[0].strip() for line in first.strip().splitlines()][:2] == ["make serve", "make test"]


def test_every_make_command_in_the_readme_is_a_makefile_target():
    used = {c.split()[1] for c in sh_commands() if c.startswith("make ")}
    assert used and used <= make_targets(), used - make_targets()


def test_make_serve_serves_the_default_model_on_port_8000():
    recipe = re.search(r"^serve:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), flags=re.M).group(1)
    assert "radixserve serve" in recipe and "--host 127.0.0.1" in recipe and "--port 8000" in recipe
    assert "--model" not in recipe


def test_every_bench_script_the_readme_names_exists_and_make_bench_runs_it():
    named = set(re.findall(r"bench/[\w/]+\.py", README))
    assert named, "the README names its benchmark scripts"
    makefile = (ROOT / "Makefile").read_text()
    compare = (ROOT / "bench" / "compare.py").read_text()
    for script in named:
        assert (ROOT / script).exists(), script
        # run by a make target, or started / imported by bench/compare.py, which `make bench` runs
        assert script in makefile or Path(script).name in compare, f"{script} is not run by a make target"


def test_every_source_file_the_readme_names_exists():
    named = set(re.findall(r"\b(?:api|runtime|radix|grammar|kernels)/[\w/]*\w\.(?:py|cpp)\b", README))
    assert named
    assert [path for path in sorted(named) if not (ROOT / path).exists()] == []


def test_flags_table_documents_every_serve_flag():
    parser = build_parser()
    serve = next(a for a in parser._actions if a.dest == "command").choices["serve"]
    flags = {opt for a in serve._actions for opt in a.option_strings if opt.startswith("--") and opt != "--help"}
    documented = set(re.findall(r"`(--[a-z-]+)`", README.split("## Flags", 1)[1].split("\n## ", 1)[0]))
    assert flags - documented == set(), "flags missing from the README table"
    assert documented - flags == set(), "the README documents flags that do not exist"


def curl(cmd: str, api) -> str:
    cmd = cmd.replace(DEFAULT_URL, api.url).replace('"SmolLM2-135M-Instruct"', json.dumps(api.model))
    return subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120, check=True).stdout


def test_curl_example_answers(api):
    (cmd,) = [c for c in sh_commands() if c.startswith("curl") and '"stream": true' not in c]
    reply = json.loads(curl(cmd, api))
    assert reply["choices"][0]["message"]["content"]
    assert reply["usage"]["completion_tokens"] > 0


def test_curl_streaming_example_streams_chunks_then_done(api):
    (cmd,) = [c for c in sh_commands() if c.startswith("curl") and '"stream": true' in c]
    events = [line[len("data: "):] for line in curl(cmd, api).splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert chunks[-1]["usage"]["completion_tokens"] > 0


def json_objects(text: str) -> list[dict]:
    """Every JSON object printed in `text`, in order."""
    decoder, found, i = json.JSONDecoder(), [], 0
    while (i := text.find("{", i)) != -1:
        try:
            obj, end = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            i += 1
            continue
        found.append(obj)
        i = end
    return found


def test_openai_client_example_runs_and_prints_valid_json_and_tool_arguments(api):
    code = block_containing("python", "from openai import OpenAI").replace(DEFAULT_URL, api.url)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "README.md", "exec"), {})
    person, arguments = json_objects(printed.getvalue())[-2:]
    assert set(person) == {"name", "born"} and 1800 <= person["born"] <= 1900
    assert isinstance(arguments["city"], str)
    api.wait_idle()


def test_python_engine_example_runs():
    code = block_containing("python", "Engine(EngineConfig(")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, cwd=ROOT, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Paris" in out.stdout
    assert isinstance(json_objects(out.stdout)[-1]["city"], str)


def test_generate_command_answers():
    (cmd,) = [c for c in sh_commands() if " generate " in c]
    argv = shlex.split(cmd)
    argv[0] = str(Path(sys.executable).with_name("radixserve"))
    out = subprocess.run(argv, capture_output=True, text=True, timeout=180, cwd=ROOT,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Paris" in out.stdout


def test_serve_with_another_model_command_serves_that_file():
    from radixserve.runtime.models.loader import default_model_path
    from .api_server import free_port

    (cmd,) = [c for c in sh_commands() if " serve --model " in c]
    port = free_port()
    argv = shlex.split(cmd.replace("path/to/model.gguf", str(default_model_path())).replace("8001", str(port)))
    argv[0] = str(Path(sys.executable).with_name("radixserve"))
    proc = subprocess.Popen(argv + ["--kv-cache-tokens", "2048"], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the server did not become healthy"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            time.sleep(0.3)
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).json()
        assert models["data"][0]["id"] == default_model_path().name
    finally:
        proc.terminate()
        proc.wait(timeout=30)
