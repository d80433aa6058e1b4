#!/usr/bin/env bash
# On the GPU machine, from the repository root, with .whl carried (bench/gpu/fetch_wheels.sh):
# installs the carried wheels, tests the Triton attention kernels, runs bench/gpu/device_bench.py,
# the host's share of a step (bench/host_step.py, in series and overlapped), then the CUDA test
# legs. What it measures lands in $OUT (h200.json, host_step.json, host_step_async.json,
# kernel.log, tests.log, bench.log). Budget: <= 8 min.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/bench.log"
python -c 'import numpy' 2>/dev/null || NUMPY=numpy
pip install -q --no-index --find-links .whl -r .whl/pins.txt ${NUMPY:+numpy} >>"$OUT/bench.log" 2>&1 \
  || echo "pip install from .whl failed (see bench.log)"
export PYTHONPATH="$PWD/src:$PWD/.whl/site${PYTHONPATH:+:$PYTHONPATH}"
python -c 'import torch, headrace; print("torch", torch.__version__, "cuda", torch.cuda.is_available())' \
  | tee -a "$OUT/bench.log"
# the Triton kernels against float64 first: the paths below take them where they are right
timeout 120 python -m pytest -q -x tests/kernels/test_paged_decode_triton.py \
  tests/kernels/test_paged_prefill_triton.py >"$OUT/kernel.log" 2>&1
echo "kernel tests rc=$?" >>"$OUT/kernel.log"
timeout 250 python bench/gpu/device_bench.py --out "$OUT/h200.json" >>"$OUT/bench.log" 2>&1 \
  || echo "device_bench failed or ran out of time (see bench.log)"
# the host's share of a decode step on this machine's CPU (no model): set beside the graph steps
timeout 30 python bench/host_step.py --streams 1,64,256 >"$OUT/host_step.json" 2>>"$OUT/bench.log" \
  || echo "host_step failed (see bench.log)"
timeout 30 python bench/host_step.py --streams 1,64,256 --async-scheduling \
  >"$OUT/host_step_async.json" 2>>"$OUT/bench.log" || echo "host_step --async-scheduling failed"
if python -c 'import transformers' 2>/dev/null; then  # the test models are built with it
  timeout 100 python -m pytest -q -x -k cuda tests/engine/runner/test_model_runner.py \
    tests/engine/runner/test_decode_graphs.py tests/engine/runner/test_staging.py \
    tests/engine/kv/test_kv_cache.py tests/kernels/test_host_copy.py \
    tests/engine/runner/test_launched.py tests/engine/test_engine_real.py \
    tests/engine/runner/test_sampler_top_p.py tests/api/test_serve_cuda.py \
    tests/layers/test_compiled.py >"$OUT/tests.log" 2>&1; echo "tests rc=$?" >>"$OUT/tests.log"
else
  echo "no transformers on this machine: the CUDA test legs did not run" >"$OUT/tests.log"
fi
tail -3 "$OUT/kernel.log"; tail -5 "$OUT/tests.log"; tail -30 "$OUT/bench.log"
