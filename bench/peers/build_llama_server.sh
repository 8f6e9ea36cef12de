#!/usr/bin/env bash
# Builds llama.cpp's own OpenAI-compatible server (llama-server) and its quantizer (llama-quantize,
# which bench/make_gguf.py uses to make Q4_K_M / Q6_K / Q8_0 files of real shapes) from the llama.cpp
# source that the llama-cpp-python sdist on PyPI carries, into bench/peers/llama.cpp/. About 5
# minutes on 2 cores.
# AMX is left out unless LLAMA_CPP_AMX=1: on both AMX Xeons tried here, llama-server built with it
# died at start (an illegal instruction on the first, a segfault in its thread pool on the second).
set -euo pipefail
PIN="${LLAMA_CPP_PYTHON_PIN:-llama-cpp-python==0.3.36}"
HERE="$(cd "$(dirname "$0")" && pwd)"
DEST="$HERE/llama.cpp"
PIP="${PIP:-python3 -m pip}"
if [ -x "$DEST/bin/llama-server" ] && [ -x "$DEST/bin/llama-quantize" ]; then
  echo "llama.cpp already built: $DEST/bin"; exit 0
fi
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
$PIP download -q --no-deps --no-binary :all: "$PIN" -d "$WORK"
tar xzf "$WORK"/llama_cpp_python-*.tar.gz -C "$WORK"
SRC="$(echo "$WORK"/llama_cpp_python-*/vendor/llama.cpp)"
NOAMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
[ "${LLAMA_CPP_AMX:-0}" = 1 ] && NOAMX=""
cmake -S "$SRC" -B "$WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE=ON -DCMAKE_C_FLAGS="$NOAMX" -DCMAKE_CXX_FLAGS="$NOAMX" \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF
cmake --build "$WORK/build" --target llama-server llama-quantize -j "$(nproc)"
mkdir -p "$DEST/bin"
cp "$WORK/build/bin/llama-server" "$WORK/build/bin/llama-quantize" "$DEST/bin/"
echo "built $DEST/bin/llama-server and llama-quantize"
