"""The exact int8 greedy head on real hidden states of the default model. Prints JSON.

Decodes a batch of plain-word prompts (headrace bench's) and one of random-token prompts
(vLLM's `bench serve` kind) through the runner, keeps the final hidden rows of every decode
step, then times on each step: the bf16 head (as compute_logits runs it) + argmax, the
two-limb int8 head, and the head as it dispatches (one limb with outlier channels on VNNI
without AMX), mean ms a step, and checks the head's picks against the float64 argmax.

    .venv/bin/python bench/greedy_head.py --rows 16,32 --steps 20
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import torch

from headrace.bench.workloads import Workload
from headrace.config import CacheConfig, ModelConfig
from headrace.engine.runner.model_runner import ModelRunner
from headrace.engine.runner.runner_harness import RunnerHarness
from headrace.kernels import int8_head
from headrace.kernels.argmax import argmax_rows
from headrace.loader.tokenizer import load_tokenizer


def capture(runner: ModelRunner, prompts: list[list[int]], steps: int) -> list[torch.Tensor]:
    """The head's input rows of each decode step with every prompt in it."""
    rows: list[torch.Tensor] = []
    real = int8_head.Int8GreedyHead.argmax

    def keep(self: int8_head.Int8GreedyHead, hidden: torch.Tensor) -> torch.Tensor:
        if len(hidden) == len(prompts):
            rows.append(hidden.clone())
        return real(self, hidden)

    int8_head.Int8GreedyHead.argmax = keep  # type: ignore[method-assign]
    try:
        harness = RunnerHarness(runner)
        for i, p in enumerate(prompts):
            harness.add(str(i), p, steps + 1)
        for _ in range(steps + 1):
            harness.step()
    finally:
        int8_head.Int8GreedyHead.argmax = real  # type: ignore[method-assign]
    return rows


def mean_ms(fn: Callable[[torch.Tensor], object], xs: list[torch.Tensor], repeats: int) -> float:
    total = 0.0
    for x in xs:
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            fn(x)
            best = min(best, time.perf_counter() - t)
        total += best
    return round(1000 * total / len(xs), 2)


def head_runner(counts: list[int]) -> tuple[ModelRunner, int8_head.Int8GreedyHead]:
    """The default model's runner with room for the largest step of `counts`, and its int8
    head taking steps of every size (the capture goes through it)."""
    runner = ModelRunner(
        ModelConfig(dtype="auto", device="cpu"),
        CacheConfig(block_size=16, num_kv_blocks=max(counts) * 40 + 64),
    )
    head = runner.wait_greedy_head()
    assert head is not None and runner.model_dir is not None, "needs bf16 with the int8 head"
    head.max_rows = max(head.max_rows, max(counts))
    return runner, head


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rows", default="16,32")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    counts = [int(r) for r in args.rows.split(",")]
    runner, head = head_runner(counts)
    assert runner.model_dir is not None
    tok = load_tokenizer(runner.model_dir)
    words = Workload(kind="uniform", prompt_len=(32, 256), output_len=(64, 64), seed=5)
    gen = torch.Generator().manual_seed(1)
    vocab = runner.model.embed_weight.shape[0]
    report: dict[str, Any] = {}
    for n in counts:
        text = [tok.encode(words.request(i).prompt) for i in range(n)]
        lengths = torch.randint(128, 384, (n,), generator=gen).tolist()
        rand = [[2] + torch.randint(10, vocab, (k - 1,), generator=gen).tolist() for k in lengths]
        for name, prompts in (("text", text), ("random", rand)):
            xs = capture(runner, prompts, args.steps)
            if head.one_limb is not None:  # as a fresh server: outliers from the first step
                head.one_limb.reset()
            w = runner.model.embed_weight
            exact = all(
                torch.equal(head.argmax(x), (x.double() @ w.double().t()).argmax(-1))
                for x in xs[:3]
            )
            report[f"{name}_{n}rows"] = {
                "steps": len(xs),
                "bf16_matmul_argmax_ms": mean_ms(
                    lambda x: argmax_rows(runner.model.compute_logits(x)), xs, args.repeats
                ),
                "two_limbs_ms": mean_ms(
                    lambda x: head._two_limbs(x.float().contiguous()), xs, args.repeats
                ),
                "head_ms": mean_ms(head.argmax, xs, args.repeats),
                "exact": exact,
            }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
