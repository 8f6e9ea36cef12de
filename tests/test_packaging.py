"""The package works outside the checkout: Hugging Face's `kernels` and `radixserve.kernels` import side
by side, and a wheel built from the checkout holds only `radixserve` and answers `radixserve generate` from
a fresh virtual environment."""
from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# the folders that ship, as radixserve.<folder>; tests/ and bench/ stay in the checkout
PACKAGE_FOLDERS = ("api", "runtime", "radix", "grammar", "kernels")
NOT_SHIPPED = ("tests", "bench")
# the checkout must not leak onto sys.path through the environment either
ENV = {**{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")},
       "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
       "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}


def inside(path: str | Path, folder: str | Path) -> bool:
    return Path(path).resolve().is_relative_to(Path(folder).resolve())


def in_checkout(path: str | Path) -> bool:
    """In the repository's own files (its .venv, which may sit inside it, does not count)."""
    return inside(path, REPO) and not inside(path, sys.prefix)


def run(cmd: list, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=timeout)


def run_ok(cmd: list, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    r = run(cmd, cwd, timeout)
    assert r.returncode == 0, f"{cmd} exited {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return r


def source_files() -> list[str]:
    """The checkout's files as git sees them (tracked and untracked, not ignored): no .venv, build/ or
    *.egg-info, so a stale build/lib cannot leak into the wheel."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                             capture_output=True, check=True, timeout=60).stdout.decode()
        names = [n for n in out.split("\0") if n]
    except (OSError, subprocess.SubprocessError):  # not a git checkout: walk it, skipping what git ignores
        skip = {".git", ".venv", "build", "__pycache__", ".pytest_cache", ".hypothesis", "peers"}
        names = []
        for root, dirs, files in os.walk(REPO):
            dirs[:] = [d for d in dirs if d not in skip and not d.endswith(".egg-info")]
            names += [str(Path(root, f).relative_to(REPO)) for f in files]
    return sorted(n for n in names if (REPO / n).is_file())  # a deleted, still tracked file is not there


# ---- 1. the two `kernels` ------------------------------------------------------------------------------

TWO_KERNELS = """
import json
import transformers.integrations.hub_kernels
import kernels
import radixserve.kernels.bitmask
from transformers import LlamaForCausalLM
print(json.dumps({"kernels": kernels.__file__, "radixserve.kernels": radixserve.kernels.__file__,
                  "get_kernel": hasattr(kernels, "get_kernel")}))
"""


def test_hub_kernels_and_radixserve_kernels_import_in_one_process(tmp_path):
    # cwd is a temp dir, so the checkout is not on sys.path: `kernels` is what the environment installed
    r = run_ok([sys.executable, "-c", TWO_KERNELS], cwd=tmp_path, timeout=180)
    files = json.loads(r.stdout.strip().splitlines()[-1])
    assert not in_checkout(files["kernels"]), files
    assert files["get_kernel"], f"`kernels` is not Hugging Face's: {files}"
    assert Path(files["radixserve.kernels"]).resolve() == REPO / "kernels" / "__init__.py", files


def test_this_test_process_sees_hub_kernels_not_the_checkouts_folder():
    import kernels
    import transformers.integrations.hub_kernels  # noqa: F401  (it does `from kernels import ...`)

    import radixserve.kernels.bitmask  # noqa: F401

    assert not in_checkout(kernels.__file__) and hasattr(kernels, "get_kernel"), kernels.__file__
    assert Path(sys.modules["radixserve.kernels"].__file__).resolve() == REPO / "kernels" / "__init__.py"


def test_installed_radixserve_claims_only_the_radixserve_import_name():
    # the environment's own install (editable under `make setup`): pip's record of it and its import hook
    dist = importlib.metadata.distribution("radixserve")
    top_level = (dist.read_text("top_level.txt") or "radixserve").split()
    assert top_level == ["radixserve"]
    owners = importlib.metadata.packages_distributions()
    assert "radixserve" not in owners.get("kernels", []), owners.get("kernels")
    for name in PACKAGE_FOLDERS:
        assert "radixserve" not in owners.get(name, []), (name, owners.get(name))
    for f in dist.files or []:
        assert f.parts[0] not in PACKAGE_FOLDERS + NOT_SHIPPED, f"radixserve installs {f} at top level"
    for module in list(sys.modules.values()):  # setuptools' editable finder maps import names to folders
        mapping = getattr(module, "MAPPING", None)
        if getattr(module, "__name__", "").startswith("__editable___radixserve") and isinstance(mapping, dict):
            assert set(mapping) == {"radixserve"}, mapping


# ---- 2. the wheel ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel of the checkout, built from a copy of its files (an in-tree build would write build/ and
    *.egg-info into the shared checkout)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    for name in source_files():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, src / name)
    try:  # setuptools>=68 (what the pyproject builds with) is here: build with it, no isolated env to install
        major = int(importlib.metadata.version("setuptools").split(".")[0])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        major = 0
    isolation = ["--no-build-isolation", "--no-index"] if major >= 68 else []
    run_ok([sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-q", "-w", tmp / "dist", src],
           cwd=tmp, timeout=300)
    (whl,) = (tmp / "dist").glob("radixserve-*.whl")
    return whl


@pytest.fixture(scope="module")
def wheel_venv(wheel, tmp_path_factory) -> Path:
    """A fresh venv holding only the wheel; this environment's site-packages is on its path through a plain
    path line in a .pth (not processed as a site dir, so the checkout's editable hook stays inactive)."""
    venv = tmp_path_factory.mktemp("venv") / "venv"
    run_ok([sys.executable, "-m", "venv", "--without-pip", venv], cwd=venv.parent, timeout=120)
    python = venv / "bin" / "python"
    run_ok([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q", wheel],
           cwd=venv.parent, timeout=300)
    site = Path(run_ok([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                       cwd=venv.parent, timeout=60).stdout.strip())
    deps = dict.fromkeys([sysconfig.get_path("purelib"), sysconfig.get_path("platlib")])
    (site / "_radixserve_test_deps.pth").write_text("".join(f"{p}\n" for p in deps))
    return venv


def wheel_names(whl: Path) -> list[str]:
    with zipfile.ZipFile(whl) as z:
        names = z.namelist()
        (record,) = [n for n in names if n.endswith(".dist-info/RECORD")]
        recorded = {line.split(",")[0] for line in z.read(record).decode().splitlines() if line}
    assert recorded == set(names), "RECORD and the wheel's files disagree"
    return names


def test_wheel_installs_nothing_but_radixserve_at_top_level(wheel):
    version = wheel.name.split("-")[1]
    dist_info = f"radixserve-{version}.dist-info"
    names = wheel_names(wheel)
    tops = {n.split("/")[0] for n in names}
    assert tops == {"radixserve", dist_info}, sorted(tops - {"radixserve", dist_info})
    for folder in NOT_SHIPPED:
        assert not [n for n in names if n.startswith(f"radixserve/{folder}/")], f"the wheel ships {folder}/"
    with zipfile.ZipFile(wheel) as z:
        if f"{dist_info}/top_level.txt" in names:
            assert z.read(f"{dist_info}/top_level.txt").decode().split() == ["radixserve"]
        assert "radixserve = radixserve.api.cli:main" in z.read(f"{dist_info}/entry_points.txt").decode()


def test_wheel_ships_every_module_of_the_package(wheel):
    names = set(wheel_names(wheel))
    for required in ("radixserve/__init__.py", "radixserve/runtime/engine.py", "radixserve/api/cli.py",
                     "radixserve/kernels/bitmask.py", "radixserve/kernels/cpu_kernels.cpp"):
        assert required in names
    modules = ["__init__.py"] + [n for n in source_files() if n.endswith(".py") and n.split("/")[0] in PACKAGE_FOLDERS]
    assert any(m.startswith("runtime/models/") for m in modules)
    missing = [m for m in modules if f"radixserve/{m}" not in names]
    assert not missing, f"modules of the checkout missing from the wheel: {missing}"


def test_wheel_answers_generate_chat_outside_the_checkout(wheel_venv, tmp_path):
    python = wheel_venv / "bin" / "python"
    where = run_ok([python, "-c", "import radixserve.api.cli, radixserve; print(radixserve.__file__)"],
                   cwd=tmp_path, timeout=120).stdout.strip()
    assert inside(where, wheel_venv) and not in_checkout(where), where
    r = run_ok([wheel_venv / "bin" / "radixserve", "generate", "--chat",
                "What is the capital of France? Answer in one sentence.", "--max-tokens", "16",
                "--temperature", "0", "--kv-cache-tokens", "1024"], cwd=tmp_path, timeout=300)
    assert r.stdout.strip(), r.stderr
    assert "Paris" in r.stdout, r.stdout  # greedy SmolLM2-135M-Instruct: "The capital of France is Paris."


def test_import_kernels_in_the_wheel_venv_is_not_this_project(wheel_venv, tmp_path):
    code = "import kernels, radixserve; print(kernels.__file__); print(radixserve.__file__)"
    kernels_file, radixserve_file = run_ok([wheel_venv / "bin" / "python", "-c", code], cwd=tmp_path,
                                           timeout=120).stdout.split()
    assert not in_checkout(kernels_file), kernels_file
    assert not inside(kernels_file, Path(radixserve_file).parent), kernels_file
    hub = importlib.metadata.distribution("kernels").locate_file("kernels/__init__.py")
    assert Path(kernels_file).resolve() == Path(hub).resolve(), "`kernels` is not Hugging Face's"
