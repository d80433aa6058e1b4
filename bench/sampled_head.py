"""Sampled rows on real hidden states of the default model: the reference path (the bf16 head +
Sampler) against the screened sampler (the int8 head's bounds, exact rejection; with
--top-p, screened_top_p.py's membership checks). Prints JSON.

Decodes plain-word prompts (or with --prompts random, random-token ones: vLLM's `bench serve`
kind, whose flat next-token distributions are the envelope's hard case) through the runner
(bench/greedy_head.py's capture), then on each
captured step times both ways, interleaved (A, B, A, B ...), at each row count and
temperature; reports mean ms a step, the ratio, proposals per accepted token, exact logits
computed per row and rows handed back to the full head. Gemma 3 270M: head 262,144 x 640.

    .venv/bin/python bench/sampled_head.py --rows 1,4,16,32,64 --steps 4
    .venv/bin/python bench/sampled_head.py --rows 1,2,4 --temperatures 1.0,0.8 --top-p 0.95,0.9
    .venv/bin/python bench/sampled_head.py --rows 16,32 --temperatures 0.8 --prompts random \
        --outliers 0,8,16 --steps 10
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch
from greedy_head import capture, head_runner

from headrace.bench.workloads import Workload
from headrace.engine.outputs import ScheduledRequest
from headrace.engine.runner.model_runner import ModelRunner
from headrace.engine.runner.sampler import Sampler
from headrace.engine.runner.screened_sampler import ScreenedSampler
from headrace.kernels.int8_envelope import OUTLIERS
from headrace.loader.tokenizer import load_tokenizer
from headrace.request import SamplingParams


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rows", default="1,4,16,32,64")
    p.add_argument("--temperatures", default="0.8,1.0")
    p.add_argument("--top-p", default="1.0", help="comma list: 1.0 = off")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--prompts", choices=("words", "random"), default="words")
    p.add_argument("--outliers", default=str(OUTLIERS), help="comma list: the envelope's")
    args = p.parse_args()
    counts = [int(r) for r in args.rows.split(",")]
    runner, _ = head_runner(counts)
    assert runner.model_dir is not None
    tok = load_tokenizer(runner.model_dir)
    words = Workload(kind="uniform", prompt_len=(32, 256), output_len=(64, 64), seed=5)
    report: dict[str, Any] = {"cpu": _cpu_name(), "threads": torch.get_num_threads()}
    gen = torch.Generator().manual_seed(1)
    vocab = runner.model.embed_weight.shape[0]
    for n in counts:
        if args.prompts == "random":  # as bench/greedy_head.py's
            lengths = torch.randint(128, 384, (n,), generator=gen).tolist()
            prompts = [
                [2] + torch.randint(10, vocab, (k - 1,), generator=gen).tolist() for k in lengths
            ]
        else:
            prompts = [tok.encode(words.request(i).prompt) for i in range(n)]
        xs = capture(runner, prompts, args.steps)
        for t in (float(v) for v in args.temperatures.split(",")):
            for top_p in (float(v) for v in args.top_p.split(",")):
                for k in (int(v) for v in args.outliers.split(",")):
                    key = f"{n}rows_T{t}" + (f"_p{top_p}" if top_p < 1 else "") + f"_out{k}"
                    report[key] = _compare(runner, xs, t, top_p, args.repeats, k)
    print(json.dumps(report, indent=1))


def _compare(
    runner: ModelRunner,
    xs: list[torch.Tensor],
    t: float,
    top_p: float,
    repeats: int,
    outliers: int,
) -> Any:
    assert runner.greedy_head is not None
    screened = ScreenedSampler(runner.greedy_head, seed=0, outliers=outliers)
    sampler = Sampler(seed=0)
    params = SamplingParams(temperature=t, top_p=top_p)
    reqs = [ScheduledRequest(str(i), [1], 0, [0], True, params, 0) for i in range(len(xs[0]))]
    ref_s, new_s = 0.0, 0.0
    for x in xs:
        best_ref, best_new = float("inf"), float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            sampler(runner.model.compute_logits(x), reqs)
            best_ref = min(best_ref, time.perf_counter() - start)
            start = time.perf_counter()
            screened(x, reqs, sampler)
            best_new = min(best_new, time.perf_counter() - start)
        ref_s, new_s = ref_s + best_ref, new_s + best_new
    st = screened.stats
    return {
        "steps": len(xs),
        "reference_ms": round(1000 * ref_s / len(xs), 2),
        "screened_ms": round(1000 * new_s / len(xs), 2),
        "ratio": round(ref_s / new_s, 2),
        "proposals_per_token": round(st.proposals / max(st.accepted, 1), 3),
        "rescored_per_row": round(st.rescored / max(st.rows, 1), 2),
        "fallbacks": st.fallbacks,
        "violations": st.violations,
        "top_p": vars(screened.top_p.stats),
    }


def _cpu_name() -> str:
    with open("/proc/cpuinfo") as f:
        return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")


if __name__ == "__main__":
    main()
