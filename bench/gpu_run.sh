#!/usr/bin/env bash
# The one command on a GPU machine that reaches no package registry (run from the repository root,
# after `make gpu-bundle` built .gpu/ here and .gpu/ travelled with the tree):
#
#     bench/gpu_run.sh              # results in $OUT (default bench/results/gpu_run/)
#     GPU_RUN_ARGS=--cpu-smoke PYTHON=... bench/gpu_run.sh   # a dry run of this script without a GPU
#
# 1. installs .gpu/wheels offline into a directory of its own, put before the image's packages;
#    this tree is importable as `radixserve` through a link there (nothing is built);
# 2. imports everything the engine, the server and gpu_check use, so a missing wheel fails in seconds;
# 3. runs bench/gpu_check.py: the engine section on the default model's shape with random weights,
#    then the kernel sections, each under its own timeout and all within one deadline (well inside
#    9 minutes). Each writes its JSON and log to $OUT as it goes: a kill loses only the step it hit.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/gpu_run}
PY=${PYTHON:-python3}
DEADLINE=${GPU_RUN_DEADLINE:-500}   # seconds for everything
mkdir -p "$OUT"
START=$SECONDS
log() { echo "[gpu_run $((SECONDS - START))s] $*" | tee -a "$OUT/run.log" >&2; }

[ -d .gpu/wheels ] && [ -f .gpu/model/config.json ] || { log "no .gpu/ bundle: run 'make gpu-bundle' first"; exit 2; }
SITE=$(mktemp -d)/site
if ! $PY -m pip install -q --no-index --no-deps --target "$SITE" .gpu/wheels/*.whl >>"$OUT/run.log" 2>&1; then
    # no pip on the image: a wheel is a zip of its package directories
    log "pip install failed; unpacking the wheels"
    $PY -c 'import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]' "$SITE" .gpu/wheels/*.whl || exit 2
fi
ln -s "$PWD" "$SITE/radixserve"
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# the CPU reference engine on plain torch: no ~40 s compile of the C++ kernels on device time
export RADIXSERVE_DISABLE_CPU_KERNELS=1
log "wheels installed in $SITE"

# -P: the working directory stays off sys.path (its kernels/ would shadow the hub's `kernels` that
# transformers may import); the package is imported through the link, as the checks do
timeout -k 5 120 $PY -P - "$OUT/environment.json" <<'EOF' 2>&1 | tee -a "$OUT/run.log" || { log "imports failed: a wheel is missing from .gpu/ (bench/gpu_wheels.txt)"; exit 3; }
import importlib, json, sys
mods = ["torch", "triton", "transformers", "tokenizers", "numpy", "safetensors", "jinja2", "prometheus_client",
        "xgrammar", "jsonschema", "pydantic", "fastapi", "starlette", "sse_starlette", "uvicorn", "openai", "gguf",
        "radixserve", "radixserve.api.server", "radixserve.grammar.xgrammar_backend", "radixserve.kernels.triton_attention",
        "radixserve.kernels.bitmask", "radixserve.runtime.engine"]
versions = {}
for m in mods:
    versions[m] = getattr(importlib.import_module(m), "__version__", None)
import torch
env = dict(versions=versions, python=sys.version, cuda=torch.version.cuda, device_available=torch.cuda.is_available(),
           device=torch.cuda.get_device_name() if torch.cuda.is_available() else None,
           # before the engine sets them: what the image defaults to
           allow_tf32_matmul=torch.backends.cuda.matmul.allow_tf32, allow_tf32_cudnn=torch.backends.cudnn.allow_tf32,
           float32_matmul_precision=torch.get_float32_matmul_precision())
open(sys.argv[1], "w").write(json.dumps(env, indent=1, default=str))
print(json.dumps(env, default=str))
EOF
log "imports ok"

# step NAME SECONDS ARGS...: one gpu_check run, bounded by its own limit and by what is left
step() {
    local name=$1 limit=$2; shift 2
    local left=$((DEADLINE - (SECONDS - START)))
    [ "$left" -lt "$limit" ] && limit=$left
    if [ "$limit" -lt 20 ]; then log "$name: skipped, the deadline is near"; return; fi
    log "$name: up to ${limit}s"
    timeout -k 10 "$limit" $PY bench/gpu_check.py "$@" ${GPU_RUN_ARGS:-} --json "$OUT/$name.json" >"$OUT/$name.log" 2>&1
    log "$name: exit $? ($(tail -n 1 "$OUT/$name.log"))"
}
step engine 260 --sections engine --model .gpu/model --random-weights
step kernels 60 --sections kernels
step roofline 60 --sections roofline
step throughput 150 --sections throughput
log "done"
