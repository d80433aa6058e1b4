"""Where a decode (and a prefill) step of the default model goes, by category. Prints JSON.

Wall time per category, from wrappers timed with perf_counter around the call sites (the C
kernels run through ctypes, which torch.profiler does not see): the layers' matmuls, the
head, decode attention, fused norms and activations, the greedy pick, and the rest (rotary,
KV writes, step inputs, Python). Median over steps.

    .venv/bin/python bench/step_profile.py                 # bf16 (default here), batch 1 and 32
    .venv/bin/python bench/step_profile.py --batches 1,8,32 --context 300
    .venv/bin/python bench/step_profile.py --batches 16 --temperature 0.8   # sampled rows
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import forward  # noqa: E402  (beside this script: the same random prompts)

import headrace.engine.runner.model_runner as model_runner  # noqa: E402
import headrace.engine.runner.sampler as sampler  # noqa: E402
import headrace.layers.activation as activation  # noqa: E402
import headrace.layers.attention as attention  # noqa: E402
import headrace.layers.linear as linear  # noqa: E402
import headrace.layers.norm as norm  # noqa: E402
import headrace.models.base as base  # noqa: E402
from headrace.config import CacheConfig, ModelConfig  # noqa: E402
from headrace.engine.runner.runner_harness import GREEDY, RunnerHarness  # noqa: E402
from headrace.engine.runner.screened_sampler import ScreenedSampler  # noqa: E402
from headrace.kernels import bf16_linear, block_linear, fused, q8_head  # noqa: E402
from headrace.kernels.int8_envelope import Int8Envelope  # noqa: E402
from headrace.kernels.int8_head import Int8GreedyHead  # noqa: E402
from headrace.kernels.int8_linear import Int8Linear  # noqa: E402
from headrace.request import SamplingParams  # noqa: E402

SPENT: dict[str, float] = defaultdict(float)


def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            SPENT[name] += time.perf_counter() - start

    return wrapper


def instrument() -> None:
    linear.packed_linear = timed("layer matmuls", linear.packed_linear)
    bf16_linear.linear = timed("layer matmuls", bf16_linear.linear)
    block_linear.linear = timed("layer matmuls (GGUF blocks)", block_linear.linear)
    Int8Linear.__call__ = timed("int8 layer matmuls", Int8Linear.__call__)  # type: ignore[method-assign]
    base.packed_linear = timed("head matmul", base.packed_linear)
    # the GGUF's own Q8_0 head: a step's few sampled rows, and rows the screened sampler gave up on
    q8_head.logits = timed("head (Q8_0 logits)", q8_head.logits)
    attention.paged_decode = timed("decode attention", attention.paged_decode)
    attention._prefill = timed("prefill attention", attention._prefill)
    norm.fused.rms_norm = timed("norms (fused)", fused.rms_norm)  # type: ignore[attr-defined]
    activation.fused.act_mul = timed("gelu x up (fused)", fused.act_mul)  # type: ignore[attr-defined]
    sampler.argmax_rows = timed("greedy argmax", sampler.argmax_rows)
    Int8GreedyHead.argmax = timed("int8 greedy head", Int8GreedyHead.argmax)  # type: ignore[method-assign]
    model_runner.build_step_inputs = timed("step inputs", model_runner.build_step_inputs)
    # A sampled row's head (screened_sampler.py): the int8 envelope's scan, then the rejection
    # rounds (proposals, their bounds and exact logits); rows it hands back take the full head.
    Int8Envelope.envelope = timed("sampled: int8 envelope", Int8Envelope.envelope)  # type: ignore[method-assign]
    ScreenedSampler._reject = timed("sampled: rejection rounds", ScreenedSampler._reject)  # type: ignore[method-assign]


def timed_step(harness: RunnerHarness) -> dict[str, float]:
    """One step: ms per category, the untimed rest, and the whole step."""
    SPENT.clear()
    start = time.perf_counter()
    harness.step()
    total = time.perf_counter() - start
    row = {k: v * 1e3 for k, v in SPENT.items()}
    row["rest (rotary, KV writes, Python)"] = total * 1e3 - sum(row.values())
    row["step"] = total * 1e3
    return row


def profile(
    runner: Any, batch: int, context: int, steps: int, params: SamplingParams = GREEDY
) -> dict[str, float]:
    harness = RunnerHarness(runner)
    for i, p in enumerate(forward.prompts(batch, context, runner.vocab_size, 0)):
        harness.add(str(i), p, steps + 2, params)
    harness.step()
    harness.step()
    per_step = [timed_step(harness) for _ in range(steps)]
    keys = per_step[0].keys()
    return {k: round(statistics.median(r.get(k, 0.0) for r in per_step), 2) for k in keys}


def prefill(runner: Any, seqs: int, length: int) -> dict[str, float]:
    rows = []
    for r in range(4):
        harness = RunnerHarness(runner)
        for i, p in enumerate(forward.prompts(seqs, length, runner.vocab_size, 100 + r)):
            harness.add(str(i), p, 1)
        rows.append(timed_step(harness))
    best = min(rows[1:], key=lambda r: r["step"])
    return {k: round(v, 2) for k, v in best.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--batches", default="1,32")
    p.add_argument("--context", type=int, default=300)
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--gguf-blocks", default="auto", help="auto | off")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy rows")
    p.add_argument("--top-p", type=float, default=1.0)
    args = p.parse_args()
    instrument()
    batches = [int(b) for b in args.batches.split(",")]
    runner = model_runner.ModelRunner(
        ModelConfig(dtype=args.dtype, device="cpu", gguf_blocks=args.gguf_blocks),
        CacheConfig(block_size=16, num_kv_blocks=max(batches) * 30 + 512),
    )
    runner.wait_greedy_head()
    report: dict[str, Any] = {"dtype": str(runner.dtype), "context": args.context}
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, max_tokens=1 << 30)
    report["sampling"] = {"temperature": args.temperature, "top_p": args.top_p}
    for b in batches:
        report[f"decode_batch{b}_ms"] = profile(runner, b, args.context, args.steps, params)
    report["prefill_2x256_ms"] = prefill(runner, 2, 256)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
