"""top_p on real logits: the sampler's ways of drawing from the set (kernels/sample_draw.c, the
CPU's: the set and the draw in C, nothing listed; engine/runner/top_p.py's torch topk, CUDA's,
then the inverse CDF over the listed set) against a full sort of every row (the path before
both), on the same captured rows. Prints JSON.

    flock /tmp/bench.lock .venv/bin/python bench/sampler_top_p.py --rows 1,16,32

Decodes prompts through the runner (bench/greedy_head.py's capture): half plain-word prompts,
half random-token prompts (as vLLM's `bench serve`), whose rows are the flattest; takes the
head's logits of the last captured step and times `Sampler()(logits, requests)` at each
temperature / top_p, the two ways alternating; reports the median ms, the ratio and the size
of the kept set (tokens: least, median, most of the rows).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from typing import Any

import torch
from greedy_head import capture, head_runner
from sampled_head import _cpu_name

from headrace.bench.workloads import Workload
from headrace.engine.outputs import ScheduledRequest
from headrace.engine.runner import sampler as sampler_mod
from headrace.engine.runner.sampler import Sampler
from headrace.engine.runner.top_p import TopPSets, top_p_mask
from headrace.kernels import sample_draw
from headrace.loader.tokenizer import load_tokenizer
from headrace.request import SamplingParams


def full_sort_top_p(x: torch.Tensor, ps: list[float]) -> TopPSets:
    """The path before: sort all of each row, draw over the whole masked row."""
    rows = [i for i, p in enumerate(ps) if p < 1.0]
    sub = x[rows]
    sorted_x, order = sub.sort(dim=-1, descending=True)
    probs = torch.softmax(sorted_x, dim=-1)
    p = torch.tensor([ps[i] for i in rows], dtype=probs.dtype)[:, None]
    drop_sorted = (probs.cumsum(dim=-1) - probs) >= p
    drop_sorted[:, 0] = False
    drop = torch.zeros_like(drop_sorted).scatter_(1, order, drop_sorted)
    ids = torch.arange(x.shape[1]).expand(len(rows), -1)
    return TopPSets(rows, ids, sub.masked_fill(drop, float("-inf")))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", default="1,16,32")
    ap.add_argument("--settings", default="1.0:0.95,0.8:0.95,0.8:0.9")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    counts = [int(r) for r in args.rows.split(",")]
    runner, head = head_runner([max(counts)])
    assert runner.model_dir is not None
    tok = load_tokenizer(runner.model_dir)
    words = Workload(kind="uniform", prompt_len=(32, 256), output_len=(64, 64), seed=5)
    rng = random.Random(3)
    n = max(counts)
    prompts = [tok.encode(words.request(i).prompt) for i in range(n - n // 2)]
    prompts += [[rng.randrange(1000, 200_000) for _ in range(200)] for _ in range(n // 2)]
    x = capture(runner, prompts, 2)[-1]
    logits = runner.model.compute_logits(x)  # [n, V] bf16
    order = [i for pair in zip(range(n // 2), range(n - n // 2, n), strict=False) for i in pair]
    order += [i for i in range(n) if i not in order]  # plain and random rows alternate
    report: dict[str, Any] = {"cpu": _cpu_name(), "threads": torch.get_num_threads()}
    for rows in counts:
        batch = logits[order[:rows]]
        for setting in args.settings.split(","):
            t, p = (float(v) for v in setting.split(":"))
            report[f"{rows}rows_T{t}_p{p}"] = _compare(batch, t, p, args.repeats)
    print(json.dumps(report, indent=1))


def _compare(logits: torch.Tensor, t: float, p: float, repeats: int) -> dict[str, Any]:
    params = SamplingParams(temperature=t, top_p=p)
    reqs = [ScheduledRequest(str(i), [1], 0, [0], True, params, 0) for i in range(len(logits))]
    partial, c_ok = sampler_mod.top_p_sets, sample_draw.supported
    times: dict[str, list[float]] = {"full_sort": [], "topk": [], "c_draw": []}
    for _ in range(repeats):
        for name in times:
            sampler_mod.top_p_sets = full_sort_top_p if name == "full_sort" else partial  # type: ignore[assignment]
            sample_draw.supported = c_ok if name == "c_draw" else lambda x: False  # type: ignore[assignment]
            start = time.perf_counter()
            Sampler(seed=0)(logits, reqs)
            times[name].append(time.perf_counter() - start)
    sampler_mod.top_p_sets, sample_draw.supported = partial, c_ok  # type: ignore[assignment]
    kept = (top_p_mask(logits.float() / t, [p] * len(logits)) > float("-inf")).sum(-1)
    full, topk, c_draw = (statistics.median(v) for v in times.values())
    return {
        "full_sort_ms": round(1000 * full, 1),
        "topk_ms": round(1000 * topk, 1),
        "c_draw_ms": round(1000 * c_draw, 1),
        "ratio_topk": round(topk / c_draw, 2),
        "kept_tokens": {
            "min": int(kept.min()),
            "median": int(kept.median()),
            "max": int(kept.max()),
        },
    }


if __name__ == "__main__":
    main()
