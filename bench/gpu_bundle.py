"""Build `.gpu/`: everything a GPU machine without a package registry needs to run
bench/gpu_run.sh, in under 60 MiB (the machine takes at most 64 MiB with the working tree).

    python bench/gpu_bundle.py            # `make gpu-bundle`; --out DIR, --no-download

- `.gpu/wheels/`: cp312 manylinux wheels of every pin in bench/gpu_wheels.txt: the packages the
  engine, the server and bench/gpu_check.py import that the machine's image lacks, and their
  dependency tree. The image has Python 3.12 with torch 2.11 (CUDA 13), triton 3.6, transformers
  5.17, tokenizers, numpy, safetensors, jinja2, prometheus-client, httpx and anyio (`IMAGE`).
  `radixserve` itself is the working tree (gpu_run.sh links it), never a wheel.
- The closure is checked, not trusted: every requirement of every bundled wheel (markers read for
  CPython 3.12 on x86-64 Linux) must be pinned at a version its specifier admits, or be on the
  image at a version that surely satisfies it. Where the image's version may be too old (pip would
  upgrade it; `--no-deps` will not), the package is pinned too and the bundled copy shadows the
  image's.
- `.gpu/model/`: the default model without weights: a Llama `config.json` of its shape and its
  tokenizer files. `gpu_check.py --model .gpu/model --random-weights` builds the weights there.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PINS = ROOT / "bench" / "gpu_wheels.txt"
LIMIT_BYTES = 60 << 20
# What the GPU machine's image holds: the packages its description names, and what pip installed with
# them. A version is the lowest the image can have: its description's own, or the floor that torch
# 2.11, transformers 5.17 or httpx declare for it; None where nothing bounds it.
IMAGE = {"torch": "2.11", "triton": "3.6", "transformers": "5.17", "tokenizers": "0.22", "numpy": "1.17",
         "safetensors": "0.4.3", "jinja2": None, "prometheus-client": None, "httpx": None, "anyio": None,
         "filelock": None, "typing-extensions": "4.10", "sympy": "1.13.3", "mpmath": None, "networkx": "2.5.1",
         "fsspec": "0.8.5", "setuptools": None, "markupsafe": None, "huggingface-hub": "1.0", "packaging": "20.0",
         "pyyaml": "5.1", "regex": None, "tqdm": "4.27", "hf-xet": None, "certifi": None, "httpcore": None,
         "h11": None, "idna": None, "sniffio": None}
TARGET = default_environment() | {"python_version": "3.12", "python_full_version": "3.12.0", "sys_platform": "linux",
                                  "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
                                  "implementation_name": "cpython", "platform_python_implementation": "CPython"}
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64",
             "linux_x86_64")


def read_pins(path: Path = PINS) -> dict[str, str]:
    """name -> version of every `name==version` line (comments and blank lines skipped)."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            spec = list(req.specifier)
            if len(spec) != 1 or spec[0].operator != "==":
                raise ValueError(f"{path.name}: {line!r} is not an exact pin")
            pins[canonicalize_name(req.name)] = spec[0].version
    return pins


def download(dest: Path, pins: Path = PINS) -> None:
    """The pinned wheels for the image's Python, whatever this machine's Python is."""
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           "3.12", "--implementation", "cp", "--abi", "cp312", "--abi", "abi3", "--abi", "none", "-d", str(dest),
           "-r", str(pins)]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    subprocess.run(cmd, check=True)


def wheel_metadata(wheel: Path) -> tuple[str, str, list[Requirement]]:
    """A wheel's name, version and the requirements that apply on the image (no extras)."""
    with zipfile.ZipFile(wheel) as z:
        meta_path = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(z.read(meta_path).decode())
    reqs = [Requirement(r) for r in meta.get_all("Requires-Dist") or []]
    applies = [r for r in reqs if r.marker is None or r.marker.evaluate(TARGET | {"extra": ""})]
    return canonicalize_name(meta["Name"]), meta["Version"], applies


def closure_problems(wheels: list[Path], pins: dict[str, str]) -> list[str]:
    """Why the wheels would not import on the image: a pin without its wheel, a wheel for the wrong
    Python, a requirement neither pinned (at an admitted version) nor on the image."""
    image = {canonicalize_name(n): v for n, v in IMAGE.items()}
    problems, have = [], {}
    for w in wheels:
        name, version, _, tags = parse_wheel_filename(w.name)
        have[name] = version
        if not any(t.interpreter in ("cp312", "py3", "py312") or t.abi == "abi3" for t in tags):
            problems.append(f"{w.name}: not a wheel for CPython 3.12")
    for name, version in pins.items():
        if name not in have:
            problems.append(f"{name}=={version}: pinned but no wheel")
        elif str(have[name]) != str(Version(version)):
            problems.append(f"{name}: pinned {version}, wheel {have[name]}")
    for w in wheels:
        owner, _, reqs = wheel_metadata(w)
        for r in reqs:
            dep = canonicalize_name(r.name)
            if dep in pins:
                if not r.specifier.contains(pins[dep], prereleases=True):
                    problems.append(f"{owner} needs {r}, pinned {pins[dep]}")
            elif dep not in image:
                problems.append(f"{owner} needs {r}: neither pinned nor on the image")
            elif r.specifier and image[dep] is None and any(s.operator in (">=", ">", "==", "~=") for s in r.specifier):
                problems.append(f"{owner} needs {r}: the image's version is unknown; pin it")
            elif image[dep] is not None and not r.specifier.contains(image[dep], prereleases=True):
                problems.append(f"{owner} needs {r}: the image may have {image[dep]}")
    return problems


def write_model_skeleton(dest: Path) -> None:
    """The default model's shape as a Llama config.json, and its tokenizer: no weights."""
    from radixserve.runtime.models.loader import load_model_files

    files = load_model_files(None, weights=False)
    c = files.config
    if c.model_type != "llama" or c.rope_scaling or c.attention_bias:
        raise ValueError("the default model is no longer a plain Llama: update write_model_skeleton")
    dest.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": c.hidden_size,
              "intermediate_size": c.intermediate_size, "num_hidden_layers": c.num_layers,
              "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim,
              "vocab_size": c.vocab_size, "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta,
              "max_position_embeddings": c.max_context_len, "tie_word_embeddings": c.tie_word_embeddings,
              "hidden_act": c.hidden_act, "eos_token_id": c.eos_token_ids, "torch_dtype": "float32"}
    (dest / "config.json").write_text(json.dumps(config, indent=1))
    files.tokenizer.save(dest)


def tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / ".gpu"))
    ap.add_argument("--no-download", action="store_true", help="check the wheels already in OUT/wheels")
    args = ap.parse_args(argv)
    out = Path(args.out)
    wheels_dir = out / "wheels"
    pins = read_pins()
    if not args.no_download:
        wheels_dir.mkdir(parents=True, exist_ok=True)
        for stale in wheels_dir.glob("*.whl"):   # a pin that changed leaves no old wheel behind
            stale.unlink()
        download(wheels_dir)
    problems = closure_problems(sorted(wheels_dir.glob("*.whl")), pins)
    write_model_skeleton(out / "model")
    size = tree_bytes(out)
    if size > LIMIT_BYTES:
        problems.append(f"{out} is {size / 2**20:.1f} MiB, over {LIMIT_BYTES >> 20} MiB")
    print(f"{out}: {len(pins)} wheels {tree_bytes(wheels_dir) / 2**20:.1f} MiB, model skeleton "
          f"{tree_bytes(out / 'model') / 2**20:.1f} MiB, {size / 2**20:.1f} MiB in all")
    for p in problems:
        print("problem:", p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
