#!/usr/bin/env bash
# Start vLLM's OpenAI-compatible server (CPU build from setup_vllm.sh) on 127.0.0.1.
#
# Usage: bench/peers/run_vllm.sh MODEL_DIR [PORT] [extra vLLM args...]
#   MODEL_DIR: a dense bf16 Hugging Face directory of the weights, e.g. made with
#              `headrace export --model <gguf> --out DIR --dtype bfloat16` (vLLM cannot read the
#              GGUF; the config must name Gemma3ForCausalLM and the tied embedding must be stored
#              as model.embed_tokens.weight, or vLLM silently writes <pad>).
# Env overrides: VLLM_CPU_KVCACHE_SPACE (GiB, default 4), VLLM_CPU_OMP_THREADS_BIND (default 0-1)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="$HERE/.work/vllm-venv"
MODEL="${1:?usage: run_vllm.sh MODEL_DIR [PORT] [extra args]}"
PORT="${2:-8001}"
[ -x "$VENV/bin/python" ] || { echo "no vLLM venv: run bench/peers/setup_vllm.sh first" >&2; exit 1; }
[ -f "$MODEL/config.json" ] || { echo "$MODEL has no config.json" >&2; exit 1; }

export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-4}"
export VLLM_CPU_OMP_THREADS_BIND="${VLLM_CPU_OMP_THREADS_BIND:-0-1}"
export HF_HUB_OFFLINE=1
exec "$VENV/bin/python" -m vllm.entrypoints.openai.api_server \
  --model "$MODEL" --dtype bfloat16 --host 127.0.0.1 --port "$PORT" "${@:3}"
