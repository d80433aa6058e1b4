#!/usr/bin/env bash
# Build llama.cpp's `llama-server` from the sources vendored in the llama-cpp-python sdist on
# PyPI (the only registry we can reach). Nothing is committed: everything lives under
# bench/peers/.work/llamacpp (git-ignored). Takes about 5 minutes on 2 cores (more while other
# work shares them). The web UI is off and never fetched (no network at build time).
#
# Usage: bench/peers/setup_llamacpp.sh [VERSION]     (VERSION of llama-cpp-python, default: latest)
# Env:   PYTHON (default python3), JOBS (default: nproc), NICE (default 19)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
WORK="$HERE/.work/llamacpp"
PYTHON="${PYTHON:-python3}"
JOBS="${JOBS:-$(nproc)}"
NICE="${NICE:-19}"
SPEC="llama-cpp-python${1:+==$1}"

mkdir -p "$WORK/dl"
if ! ls "$WORK"/dl/llama_cpp_python-*.tar.gz >/dev/null 2>&1; then
  "$PYTHON" -m pip download --no-deps --no-binary :all: -d "$WORK/dl" "$SPEC"
fi
SDIST="$(ls "$WORK"/dl/llama_cpp_python-*.tar.gz | head -n1)"
SRC="$WORK/src"
if [ ! -d "$SRC" ]; then
  mkdir -p "$SRC"
  tar -xzf "$SDIST" -C "$SRC" --strip-components=1
fi
LLAMA="$SRC/vendor/llama.cpp"
[ -f "$LLAMA/CMakeLists.txt" ] || { echo "no vendored llama.cpp in $SDIST" >&2; exit 1; }

# ggml's AMX matmul (compiled in by -march=native where the CPU lists AMX) dies with SIGSEGV
# on this project's VMs at the first graph: build without it (AVX-512 VNNI/BF16 stay on).
NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
nice -n "$NICE" cmake -S "$LLAMA" -B "$WORK/build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE=ON \
  -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_UI=OFF \
  -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_TOOLS=ON \
  -DBUILD_SHARED_LIBS=OFF \
  -DCMAKE_C_FLAGS="$NO_AMX" -DCMAKE_CXX_FLAGS="$NO_AMX"
nice -n "$NICE" cmake --build "$WORK/build" --target llama-server -j "$JOBS"

BIN="$(find "$WORK/build" -type f -name llama-server -perm -u+x | head -n1)"
[ -n "$BIN" ] || { echo "llama-server was not built" >&2; exit 1; }
ln -sf "$BIN" "$WORK/llama-server"
"$WORK/llama-server" --version 2>&1 | head -n 3 || true
echo "llama-server: $WORK/llama-server"
