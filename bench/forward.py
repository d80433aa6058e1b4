"""Model-step speed on Gemma 3 270M against this machine's roofline and transformers.

In one run: the machine's limits (matmul GFLOP/s at 2048^2, memory bandwidth), Headrace's
decode-step tokens/s at several batch sizes and its prefill tokens/s, fp32 and bf16, and
transformers' `generate` at the same batch sizes and dtype as the baseline. Each figure is also
given as a share of its roofline: a step of batch B costs at least max(weight bytes / bandwidth,
B * 2 * params / FLOP/s); the tied 262k-token head counts in both. Prints JSON.

    .venv/bin/python bench/forward.py                           # everything (~10 min)
    .venv/bin/python bench/forward.py --threads 1               # steadier on a shared machine
    .venv/bin/python bench/forward.py --dtypes bfloat16 --batches 1,32 --no-hf
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from headrace.config import CacheConfig, ModelConfig
from headrace.engine.runner.model_runner import ModelRunner
from headrace.engine.runner.runner_harness import RunnerHarness
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
        report["results"][dtype] = run_dtype(args, dtype, batches, limits, model_dir)
    # Limits again at the end: on a shared machine the better of the two is the machine's.
    again = machine_limits(args.repeats)
    best = {k: max(v, again[k]) for k, v in limits.items()}
    report["machine"].update(best)
    for dtype, res in report["results"].items():
        rescale(res, dtype, best, batches, args.prefill_len)
    return report


def rescale(
    res: dict[str, Any], dtype: str, limits: dict[str, float], batches: list[int], prefill_len: int
) -> None:
    """Rooflines and shares against the machine's final (best measured) limits."""
    cost = Cost(**res["cost"])
    for b in batches:
        bound = roofline(limits, dtype, cost, b)
        for key in ("decode", "hf_decode"):
            if str(b) in res[key]:
                res[key][str(b)].update(_figure(res[key][str(b)]["tokens_per_s"], bound))
    bound = prefill_roofline(limits, dtype, cost, 4, 4 * prefill_len)
    res["prefill"].update(_figure(res["prefill"]["tokens_per_s"], bound))


def run_dtype(
    args: argparse.Namespace,
    dtype: str,
    batches: list[int],
    limits: dict[str, float],
    model_dir: Any,
) -> dict[str, Any]:
    """Headrace and transformers alternate per batch size, best of `rounds` each, so that a
    burst of load from elsewhere on the machine hits both alike."""
    runner = ModelRunner(
        ModelConfig(model=args.model, dtype=dtype, device="cpu"),
        CacheConfig(block_size=16, num_kv_blocks=max(batches) * 8 + 64),
    )
    hf_model = None
    if args.hf:
        from transformers import AutoModelForCausalLM

        hf_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=DTYPES[dtype]).eval()
    cost = Cost.of(runner)
    res: dict[str, Any] = {"cost": asdict(cost), "decode": {}, "hf_decode": {}}
    for b in batches:
        ours, theirs = 0.0, 0.0
        for _ in range(args.rounds):
            ours = max(ours, headrace_decode(runner, b, args.context, args.steps))
            if hf_model is not None:
                vocab = runner.vocab_size
                theirs = max(theirs, hf_decode(hf_model, b, args.context, args.hf_steps, vocab))
        bound = roofline(limits, dtype, cost, b)
        res["decode"][str(b)] = _figure(ours, bound)
        if hf_model is not None:
            res["hf_decode"][str(b)] = {
                **_figure(theirs, bound),
                "speedup": round(ours / theirs, 2),
            }
        print(
            f"{dtype} b={b}: {ours:.1f} tok/s ({ours / bound:.0%}), transformers {theirs:.1f}",
            file=sys.stderr,
        )
    tps = headrace_prefill(runner, 4, args.prefill_len, args.repeats)
    res["prefill"] = _figure(tps, prefill_roofline(limits, dtype, cost, 4, 4 * args.prefill_len))
    return res


def _figure(tokens_per_s: float, bound: float) -> dict[str, float]:
    return {
        "tokens_per_s": round(tokens_per_s, 1),
        "roofline": round(bound, 1),
        "share": round(tokens_per_s / bound, 3),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="GGUF or HF directory (default: Gemma 3 270M)")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--batches", default="1,8,32,64")
    p.add_argument("--context", type=int, default=64, help="prompt tokens before decoding")
    p.add_argument("--steps", type=int, default=8, help="timed decode steps per batch size")
    p.add_argument("--prefill-len", type=int, default=128, help="tokens of each of 4 prompts")
    p.add_argument("--hf", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--hf-steps", type=int, default=6, help="decode steps timed in transformers")
    p.add_argument("--repeats", type=int, default=3, help="best of N for limits and prefill")
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds per batch size")
    p.add_argument("--threads", type=int, default=None)
    print(json.dumps(run(p.parse_args()), indent=2))


if __name__ == "__main__":
    main()
