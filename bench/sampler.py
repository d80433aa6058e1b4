"""The sampler's cost per step with logits processors (penalties, logit_bias, bad_words) on
one or all requests of a batch, against the plain batch measured in the same run. Prints JSON.

    flock /tmp/bench.lock .venv/bin/python bench/sampler.py

A step is what the runner does after the head: `Sampler()(logits, requests)` on [32, 262144]
logits (Gemma 3's vocabulary), bf16 and fp32, plus the scheduler's side for each processed
request (`logits_inputs`: the copy of its output ids). Requests are greedy, or drawn
(temperature 0.8, seeded; no top-p, whose sort of 262k logits per row would dwarf the rest).
A processed request carries a 1,000-token prompt and 256 generated tokens, with repetition
1.1, frequency 0.3 and presence 0.3 penalties, 20 logit_bias entries and 8 bad-word sequences.
Each figure is the median of several rounds, the cases alternating; `ratio` is a case's time
over the plain batch's of the same dtype and kind.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable

import torch

from headrace.engine.logits_inputs import logits_inputs
from headrace.engine.outputs import ScheduledRequest
from headrace.engine.runner.sampler import Sampler
from headrace.request import Request, SamplingParams

VOCAB = 262144
BATCH = 32
PROMPT_TOKENS = 1000
OUTPUT_TOKENS = 256
KINDS = {
    "greedy": SamplingParams(max_tokens=1024, temperature=0.0),
    "drawn": SamplingParams(max_tokens=1024, temperature=0.8, seed=7),
}


def processed(base: SamplingParams, rng: random.Random) -> SamplingParams:
    return SamplingParams(
        max_tokens=base.max_tokens, temperature=base.temperature, top_p=base.top_p,
        seed=base.seed, repetition_penalty=1.1, frequency_penalty=0.3, presence_penalty=0.3,
        logit_bias=tuple((t, rng.uniform(-5, 5)) for t in rng.sample(range(VOCAB), 20)),
        bad_words=tuple(tuple(rng.randrange(VOCAB) for _ in range(1 + i % 3)) for i in range(8)),
    )  # fmt: skip


def make_requests(base: SamplingParams, n_processed: int, seed: int) -> list[Request]:
    rng = random.Random(seed)
    reqs = []
    for i in range(BATCH):
        params = processed(base, rng) if i >= BATCH - n_processed else base
        prompt = [rng.randrange(VOCAB) for _ in range(PROMPT_TOKENS)]
        req = Request(str(i), prompt, params, eos_token_ids=(1,))
        req.output_token_ids = [rng.randrange(VOCAB) for _ in range(OUTPUT_TOKENS)]
        reqs.append(req)
    return reqs


def step(sampler: Sampler, logits: torch.Tensor, reqs: list[Request]) -> Callable[[], object]:
    def run() -> object:
        scheduled = [
            ScheduledRequest(
                r.request_id,
                [r.output_token_ids[-1]],
                r.num_tokens - 1,
                [0],
                True,
                r.params,
                r.num_output_tokens,
                logits_inputs(r),
            )  # fmt: skip
            for r in reqs
        ]
        return sampler(logits, scheduled)

    return run


def median_ms(fns: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn()  # warm up
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    results = []
    for dtype in (torch.bfloat16, torch.float32):
        logits = (torch.randn(BATCH, VOCAB, generator=torch.Generator().manual_seed(0)) * 3).to(
            dtype
        )
        for kind, base in KINDS.items():
            cases = {
                name: step(Sampler(seed=0), logits, make_requests(base, n, seed=1))
                for name, n in (("plain_32", 0), ("plain_31_processed_1", 1), ("processed_32", 32))
            }
            ms = median_ms(cases, args.rounds)
            for name, value in ms.items():
                results.append({
                    "dtype": str(dtype).removeprefix("torch."), "kind": kind, "case": name,
                    "ms_per_step": round(value, 3), "ratio": round(value / ms["plain_32"], 3),
                })  # fmt: skip
    print(json.dumps({"batch": BATCH, "vocab": VOCAB, "threads": torch.get_num_threads(),
                      "results": results}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
