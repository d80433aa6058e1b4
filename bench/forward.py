"""Model-step speed on Gemma 3 270M against this machine's roofline and transformers.

In one run: the machine's limits (matmul GFLOP/s at 2048^2, memory bandwidth), Headrace's
decode-step tokens/s at several batch sizes and its prefill tokens/s, fp32 and bf16, and
transformers' `generate` at the same batch sizes and dtype as the baseline. Each figure is also
given as a share of its roofline: a step of batch B costs at least max(weight bytes / bandwidth,
B * 2 * params / FLOP/s); the tied 262k-token head counts in both. Prints JSON.

    .venv/bin/python bench/forward.py                           # everything (< ~10 min)
    .venv/bin/python bench/forward.py --dtypes bfloat16 --batches 1,32 --no-hf
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from headrace.config import CacheConfig, ModelConfig
from headrace.engine.model_runner import ModelRunner
from headrace.engine.runner_harness import RunnerHarness
from headrace.loader.cache import resolve_model

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def best_time(fn: Callable[[], object], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def machine_limits(repeats: int) -> dict[str, float]:
    n = 2048
    out: dict[str, float] = {}
    for name, dtype in DTYPES.items():
        a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
        seconds = best_time(lambda a=a, b=b: a @ b, repeats)  # type: ignore[misc]
        out[f"matmul_gflops_{name}"] = 2 * n**3 / seconds / 1e9
    src = torch.ones(64 << 20)  # 256 MiB, far past the caches
    dst = torch.empty_like(src)
    seconds = best_time(lambda: dst.copy_(src), repeats)
    out["bandwidth_gbs"] = 2 * src.nbytes / seconds / 1e9  # read + write
    return out


def prompts(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [
        [2] + torch.randint(10, vocab, (length - 1,), generator=gen).tolist() for _ in range(batch)
    ]


def headrace_decode(runner: ModelRunner, batch: int, context: int, steps: int) -> float:
    """Tokens/s of decode steps of `batch` sequences after `context` prompt tokens each."""
    harness = RunnerHarness(runner)
    for i, p in enumerate(prompts(batch, context, runner.vocab_size, 0)):
        harness.add(str(i), p, steps + 2)
    harness.step()  # prefill, untimed
    harness.step()  # first decode, untimed (warm-up)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        harness.step()
        times.append(time.perf_counter() - start)
    return batch / statistics.median(times)


def headrace_prefill(runner: ModelRunner, seqs: int, length: int, repeats: int) -> float:
    def once() -> None:
        harness = RunnerHarness(runner)
        for i, p in enumerate(prompts(seqs, length, runner.vocab_size, 100)):
            harness.add(str(i), p, 1)
        harness.step()

    return seqs * length / best_time(once, repeats)


def hf_decode(model: Any, batch: int, context: int, steps: int, vocab: int) -> float:
    """transformers' generate: tokens/s of its decode steps (median step, prefill excluded),
    timed from a stopping criterion that generate calls after every token."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    stamps: list[float] = []

    class Clock(StoppingCriteria):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kw: Any) -> Any:
            stamps.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    ids = torch.tensor(prompts(batch, context, vocab, 0))
    with torch.inference_mode():
        model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=steps + 2,
            min_new_tokens=steps + 2,
            pad_token_id=0,
            stopping_criteria=StoppingCriteriaList([Clock()]),
        )
    step_times = [b - a for a, b in zip(stamps[1:], stamps[2:], strict=False)]  # decode steps
    return batch / statistics.median(step_times)


def roofline(limits: dict[str, float], dtype: str, cost: Cost, batch: int) -> float:
    """Most tokens/s a step of `batch` decodes can reach: it reads every weight once (the
    tied head included) and does 2 FLOPs per parameter per token (head included)."""
    memory_s = cost.params * DTYPES[dtype].itemsize / (limits["bandwidth_gbs"] * 1e9)
    flops = batch * 2 * (cost.layer_params + cost.head_params)
    compute_s = flops / (limits[f"matmul_gflops_{dtype}"] * 1e9)
    return batch / max(memory_s, compute_s)


def prefill_roofline(limits: dict[str, float], dtype: str, cost: Cost, seqs: int, n: int) -> float:
    """Prefill computes the head only for each sequence's last token."""
    flops = 2 * (n * cost.layer_params + seqs * cost.head_params)
    return n / (flops / (limits[f"matmul_gflops_{dtype}"] * 1e9))


@dataclass(frozen=True)
class Cost:
    params: int  # every weight stored (the tied embedding once)
    layer_params: int  # weights a token's pass through the layers multiplies with
    head_params: int  # the output head's (vocab x hidden)

    @classmethod
    def of(cls, runner: ModelRunner) -> Cost:
        params = sum(p.numel() for p in runner.model.parameters())
        head = runner.model.embed_weight.numel()
        return cls(params, params - head, head)


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.threads:
        torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batches.split(",")]
    limits = machine_limits(args.repeats)
    report: dict[str, Any] = {
        "machine": {**limits, "threads": torch.get_num_threads()},
        "settings": vars(args),
        "results": {},
    }
    model_dir, _ = resolve_model(args.model)
    for dtype in args.dtypes.split(","):
        runner = ModelRunner(
            ModelConfig(model=args.model, dtype=dtype, device="cpu"),
            CacheConfig(block_size=16, num_kv_blocks=max(batches) * 8 + 64),
        )
        cost = Cost.of(runner)
        res: dict[str, Any] = {"params": cost.params, "decode": {}, "hf_decode": {}}
        for b in batches:
            tps = headrace_decode(runner, b, args.context, args.steps)
            bound = roofline(limits, dtype, cost, b)
            res["decode"][str(b)] = {
                "tokens_per_s": round(tps, 1),
                "roofline": round(bound, 1),
                "share": round(tps / bound, 3),
            }
            print(f"{dtype} decode b={b}: {tps:.1f} tok/s ({tps / bound:.0%})", file=sys.stderr)
        tps = headrace_prefill(runner, 4, args.prefill_len, args.repeats)
        compute = prefill_roofline(limits, dtype, cost, 4, 4 * args.prefill_len)
        res["prefill"] = {
            "tokens_per_s": round(tps, 1),
            "roofline": round(compute, 1),
            "share": round(tps / compute, 3),
        }
        del runner
        if args.hf:
            res["hf_decode"] = hf_baseline(model_dir, dtype, batches, args, limits, cost, res)
        report["results"][dtype] = res
    return report


def hf_baseline(
    model_dir: Any,
    dtype: str,
    batches: list[int],
    args: argparse.Namespace,
    limits: dict[str, float],
    cost: Cost,
    res: dict[str, Any],
) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=DTYPES[dtype]).eval()
    out: dict[str, Any] = {}
    for b in batches:
        tps = hf_decode(model, b, args.context, args.hf_steps, model.config.vocab_size)
        ours = res["decode"][str(b)]["tokens_per_s"]
        out[str(b)] = {
            "tokens_per_s": round(tps, 1),
            "share": round(tps / roofline(limits, dtype, cost, b), 3),
            "headrace_speedup": round(ours / tps, 2),
        }
        print(f"{dtype} transformers b={b}: {tps:.1f} tok/s", file=sys.stderr)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="GGUF or HF directory (default: Gemma 3 270M)")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--batches", default="1,8,32,64")
    p.add_argument("--context", type=int, default=64, help="prompt tokens before decoding")
    p.add_argument("--steps", type=int, default=12, help="timed decode steps per batch size")
    p.add_argument("--prefill-len", type=int, default=128, help="tokens of each of 4 prompts")
    p.add_argument("--hf", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--hf-steps", type=int, default=8, help="decode steps timed in transformers")
    p.add_argument("--repeats", type=int, default=5, help="best of N for limits and prefill")
    p.add_argument("--threads", type=int, default=None)
    print(json.dumps(run(p.parse_args()), indent=2))


if __name__ == "__main__":
    main()
