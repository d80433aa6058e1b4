"""Speculative decoding by prompt lookup, engine alone: output tokens/s, draft acceptance and
identical outputs against plain decoding, per number of draft tokens, on two prompt sets.

- `text`: the quality gate's sentence openings (`tests/data/gate_prompts.txt`): natural text.
- `random`: random token ids, 128-384 long, as vLLM's `bench serve --dataset-name random`.

Every request is greedy (or sampled at `--temperature`, with `--top-p`, seeded so that outputs
can be compared) with `ignore_eos` and `--max-tokens` tokens; `--streams` requests run at
a time (batches of that many). The settings alternate within one process (one loaded model), so
the ratios to k=0 come from the same minutes of this noisy host. Prints JSON; writes it and a
PNG under --out.

    .venv/bin/python bench/speculation.py                       # k = 0, 4; 1 and 4 streams
    .venv/bin/python bench/speculation.py --ks 0,2,4,8 --prompts 24
    .venv/bin/python bench/speculation.py --ks 0,8 --temperature 0.8   # speculative sampling
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

from headrace.config import CacheConfig, ModelConfig, SchedulerConfig
from headrace.engine.llm import LLM
from headrace.engine.runner.model_runner import ModelRunner
from headrace.loader.cache import resolve_model
from headrace.loader.tokenizer import load_tokenizer
from headrace.request import SamplingParams

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"


def prompt_sets(n: int, seed: int) -> dict[str, list[Any]]:
    text = [p for p in (DATA / "gate_prompts.txt").read_text().splitlines() if p.strip()][:n]
    rng = random.Random(seed)
    rand = [[rng.randrange(1000, 200_000) for _ in range(rng.randint(128, 384))] for _ in range(n)]
    return {"text": text, "random": rand}


def run(
    llm: LLM, prompts: list[Any], streams: int, max_tokens: int, sampling: dict[str, float]
) -> dict[str, Any]:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, **sampling)  # type: ignore[arg-type]
    sched = llm.core.scheduler
    drafted0, accepted0 = sched.spec_drafted_total, sched.spec_accepted_total
    steps = 0
    step = llm.core.step

    def counted() -> Any:
        nonlocal steps
        steps += 1
        return step()

    llm.core.step = counted  # type: ignore[method-assign]
    outputs: list[list[int]] = []
    start = time.perf_counter()
    try:
        for i in range(0, len(prompts), streams):
            outs = llm.generate(prompts[i : i + streams], params)
            outputs.extend(o.token_ids for o in outs)
    finally:
        llm.core.step = step  # type: ignore[method-assign]
    wall = time.perf_counter() - start
    drafted = sched.spec_drafted_total - drafted0
    accepted = sched.spec_accepted_total - accepted0
    tokens = sum(len(o) for o in outputs)
    return {
        "output_tokens_per_s": tokens / wall,
        "steps": steps,
        "draft_tokens": drafted,
        "accepted_tokens": accepted,
        "acceptance": accepted / drafted if drafted else None,
        "outputs": outputs,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default=None, help="default: the embedded Gemma 3 270M")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--ks", default="0,4", help="draft tokens per step to compare (0: off)")
    p.add_argument("--streams", default="1,4")
    p.add_argument("--prompts", type=int, default=16, help="per prompt set")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--out", default=str(ROOT / "bench" / "out" / "speculation"))
    args = p.parse_args()
    ks = [int(k) for k in args.ks.split(",")]
    sampling = {"temperature": args.temperature, "top_p": args.top_p}
    if args.temperature > 0:
        sampling["seed"] = 1  # each output index its own number: comparable across settings
    runner = ModelRunner(ModelConfig(model=args.model, dtype=args.dtype), CacheConfig())
    runner.wait_greedy_head()
    tokenizer = load_tokenizer(resolve_model(args.model)[0])
    sets = prompt_sets(args.prompts, seed=0)
    rows = []
    for streams in (int(s) for s in args.streams.split(",")):
        for name, prompts in sets.items():
            base: list[list[int]] | None = None
            for k in ks:
                cfg = SchedulerConfig(
                    num_speculative_tokens=k, speculative_max_seqs=streams, max_num_seqs=streams
                )
                llm = LLM(runner=runner, tokenizer=tokenizer, scheduler_config=cfg)
                llm.generate(prompts[:1], SamplingParams(max_tokens=4))  # warm-up
                r = run(llm, prompts, streams, args.max_tokens, sampling)
                outputs = r.pop("outputs")
                base = base or outputs
                r["identical_outputs"] = sum(a == b for a, b in zip(outputs, base, strict=True))
                r.update(streams=streams, prompts=name, k=k, n=len(prompts))
                rows.append(r)
                print(json.dumps(r), flush=True)
    for r in rows:
        ref = next(
            x
            for x in rows
            if (x["streams"], x["prompts"], x["k"]) == (r["streams"], r["prompts"], ks[0])
        )
        r["speedup"] = r["output_tokens_per_s"] / ref["output_tokens_per_s"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {
        "dtype": str(runner.dtype), "max_tokens": args.max_tokens, "sampling": sampling,
        "rows": rows,
    }  # fmt: skip
    (out / "speculation.json").write_text(json.dumps(result, indent=1))
    plot(rows, out / "speculation.png")
    print(json.dumps(result, indent=1))
    return 0


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    groups = sorted({(r["streams"], r["prompts"]) for r in rows})
    ks = sorted({r["k"] for r in rows})
    width = 0.8 / len(ks)
    for j, k in enumerate(ks):
        vals = [
            next(r["speedup"] for r in rows if (r["streams"], r["prompts"], r["k"]) == (s, n, k))
            for s, n in groups
        ]
        ax.bar([i + j * width for i in range(len(groups))], vals, width, label=f"k={k}")
    ax.set_xticks([i + width * (len(ks) - 1) / 2 for i in range(len(groups))])
    ax.set_xticklabels([f"{n}, {s} stream{'s' * (s > 1)}" for s, n in groups])
    ax.set_ylabel("output tokens/s vs k=0")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.legend()
    ax.set_title("Prompt-lookup speculation, engine alone")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
