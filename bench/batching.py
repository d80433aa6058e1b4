"""What continuous batching buys: one offered load through three scheduling policies.

The same Poisson arrivals (prompt and output lengths drawn uniformly) go, in one run and on
one loaded model, through (a) one request at a time, (b) static batching (wait for B requests
or T ms, then run the batch to completion with no joins) and (c) continuous batching. For each:
output tokens/s, TTFT p50/p95, end-to-end p50/p95, join wait (arrival -> first scheduled step)
p50/p99 and the model step's duration. Then, closed loop: output tokens/s with 32 concurrent
streams against 1. The engine core is driven in this process in real time (no HTTP), so the
numbers are the scheduler's and the model's. Prints JSON; writes JSON and a PNG.

    .venv/bin/python bench/batching.py                       # Gemma 3 270M, 200 requests
    .venv/bin/python bench/batching.py --num-requests 40 --rate 0.5 --max-prompt 128 \
        --max-output 48 --stream-tokens 16                   # a shrunk run

Targets (issue 3): continuous >= 2x static throughput with a lower TTFT p95; join wait p99 <=
one step + 5 ms while there is free capacity (measured at a light load, --light-rate, where
`join_steps_skipped` should be 0: each request joins the first step that begins after it
arrives); 32 streams >= 6x one stream.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from headrace.config import CacheConfig, ModelConfig, SchedulerConfig
from headrace.engine.core.engine_core import EngineCore, Runner
from headrace.engine.messages import EngineCoreRequest
from headrace.request import SamplingParams


@dataclass(frozen=True)
class Item:
    arrival: float  # seconds after the start
    prompt: list[int]
    max_tokens: int


@dataclass
class Record:
    arrival: float
    added: float = 0.0  # when the driver handed it to the core (between steps)
    queue_time: float | None = None  # core arrival -> first scheduled step
    first_token: float | None = None
    finish: float | None = None
    tokens: int = 0


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="GGUF file or HF directory (default: Gemma 3)")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--num-threads", type=int, default=None)
    p.add_argument("--num-requests", type=int, default=200)
    p.add_argument("--rate", type=float, default=2.0, help="Poisson arrivals, requests/s")
    p.add_argument("--min-prompt", type=int, default=16)
    p.add_argument("--max-prompt", type=int, default=512)
    p.add_argument("--min-output", type=int, default=8)
    p.add_argument("--max-output", type=int, default=256)
    p.add_argument("--static-batch", type=int, default=16)
    p.add_argument("--static-wait-ms", type=float, default=20.0)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=512)
    p.add_argument("--light-rate", type=float, default=None, help="default: --rate / 4")
    p.add_argument("--streams", type=int, default=32, help="closed loop: concurrent streams")
    p.add_argument("--stream-tokens", type=int, default=64, help="closed loop: tokens each")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--num-speculative-tokens",
        type=int,
        default=None,
        help="prompt-lookup draft tokens (default: the engine's; 0 compares batching alone, "
        "without speculation speeding up the single stream)",
    )
    p.add_argument("--out", type=Path, default=Path("bench/out/batching"))
    return p.parse_args()


def make_workload(args: argparse.Namespace, vocab: int) -> list[Item]:
    rng = random.Random(args.seed)
    lo = min(1000, vocab // 2)  # ordinary tokens, clear of the special ones
    t = 0.0
    items = []
    for _ in range(args.num_requests):
        t += rng.expovariate(args.rate)
        n = rng.randint(args.min_prompt, args.max_prompt)
        prompt = [rng.randrange(lo, vocab) for _ in range(n)]
        items.append(Item(t, prompt, rng.randint(args.min_output, args.max_output)))
    return items


def run_open_loop(runner: Runner, sched: SchedulerConfig, items: list[Item]) -> dict[str, Any]:
    core = EngineCore(sched, runner)
    records: dict[str, Record] = {}
    steps: list[tuple[float, int]] = []  # (duration, batch size) of steps that ran the model
    step_starts: list[float] = []
    start = time.perf_counter()
    i = 0
    while i < len(items) or core.has_work():
        now = time.perf_counter() - start
        while i < len(items) and items[i].arrival <= now:
            item = items[i]
            rid = f"r{i}"
            params = SamplingParams(max_tokens=item.max_tokens, temperature=0, ignore_eos=True)
            core.add_request(EngineCoreRequest(rid, item.prompt, params))
            records[rid] = Record(item.arrival, added=now)
            i += 1
        if not core.has_work():
            time.sleep(max(0.0, min(items[i].arrival - now, 0.05)))
            continue
        step_starts.append(time.perf_counter() - start)
        outputs, stats = core.step()
        t = time.perf_counter() - start
        if stats.num_batched_tokens:
            steps.append((stats.step_duration, stats.num_running))
        elif not outputs:
            time.sleep(0.001)  # static policy filling its batch
        for o in outputs:
            rec = records[o.request_id]
            if rec.queue_time is None and o.queue_time is not None:
                rec.queue_time = o.queue_time
            if o.new_token_ids and rec.first_token is None:
                rec.first_token = t
            rec.tokens += len(o.new_token_ids)
            if o.finished:
                rec.finish = t
    return summarize(list(records.values()), steps, step_starts)


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def steps_skipped(rec: Record, step_starts: list[float]) -> int:
    """Steps that began after the request reached the core but before the one it joined."""
    joined = rec.added + (rec.queue_time or 0.0)
    return sum(1 for s in step_starts if rec.added < s < joined - 1e-4)


def summarize(
    recs: list[Record], steps: list[tuple[float, int]], step_starts: list[float]
) -> dict[str, Any]:
    done = [r for r in recs if r.finish is not None and r.first_token is not None]
    span = max(r.finish or 0.0 for r in done) - min(r.arrival for r in recs)
    ttft = [(r.first_token or 0.0) - r.arrival for r in done]
    e2e = [(r.finish or 0.0) - r.arrival for r in done]
    join = [(r.added - r.arrival) + (r.queue_time or 0.0) for r in done]
    durations = [d for d, _ in steps]
    return {
        "requests": len(done),
        "output_tokens": sum(r.tokens for r in done),
        "duration_s": span,
        "output_tokens_per_s": sum(r.tokens for r in done) / span,
        "ttft_p50_s": pct(ttft, 50),
        "ttft_p95_s": pct(ttft, 95),
        "e2e_p50_s": pct(e2e, 50),
        "e2e_p95_s": pct(e2e, 95),
        "join_wait_p50_s": pct(join, 50),
        "join_wait_p99_s": pct(join, 99),
        # 0: every request joined the first step that began after it arrived
        "join_steps_skipped_p99": pct([steps_skipped(r, step_starts) for r in done], 99),
        "step_p50_s": pct(durations, 50),
        "step_p99_s": pct(durations, 99),
        "mean_batch": float(np.mean([b for _, b in steps])) if steps else 0.0,
        "num_steps": len(steps),
    }


def run_closed_loop(
    runner: Runner, streams: int, tokens: int, vocab: int, spec: dict[str, int]
) -> dict[str, Any]:
    """`streams` requests at once, each a 32-token prompt and exactly `tokens` new tokens."""
    sched = SchedulerConfig(max_num_seqs=max(streams, 1), max_num_batched_tokens=2048, **spec)
    core = EngineCore(sched, runner)
    rng = random.Random(streams)
    lo = min(1000, vocab // 2)
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    for i in range(streams):
        prompt = [rng.randrange(lo, vocab) for _ in range(32)]
        core.add_request(EngineCoreRequest(f"s{i}", prompt, params))
    start = time.perf_counter()
    produced = 0
    while core.has_work():
        outputs, _ = core.step()
        produced += sum(len(o.new_token_ids) for o in outputs)
    elapsed = time.perf_counter() - start
    return {"streams": streams, "output_tokens": produced, "tokens_per_s": produced / elapsed}


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["policies"])
    rows = [result["policies"][n] for n in names]
    fig, axes = plt.subplots(1, 4, figsize=(16, 4))
    axes[0].bar(names, [r["output_tokens_per_s"] for r in rows], color="tab:blue")
    axes[0].set_title("output tokens/s")
    for ax, key, title in (
        (axes[1], "ttft", "TTFT (s)"),
        (axes[2], "e2e", "end-to-end (s)"),
    ):
        x = np.arange(len(names))
        ax.bar(x - 0.2, [r[f"{key}_p50_s"] for r in rows], 0.4, label="p50")
        ax.bar(x + 0.2, [r[f"{key}_p95_s"] for r in rows], 0.4, label="p95")
        ax.set_xticks(x, names)
        ax.set_title(title)
        ax.legend()
    join_rows = [*rows, result["light_load"]]
    x = np.arange(len(join_rows))
    axes[3].bar(x - 0.2, [r["join_wait_p50_s"] for r in join_rows], 0.4, label="join p50")
    axes[3].bar(x + 0.2, [r["join_wait_p99_s"] for r in join_rows], 0.4, label="join p99")
    axes[3].plot(x, [r["step_p99_s"] for r in join_rows], "k_", markersize=20, label="step p99")
    axes[3].set_yscale("log")
    axes[3].set_xticks(x, [*names, "light load\n(continuous)"])
    axes[3].set_title("join wait (s)")
    axes[3].legend()
    fig.suptitle(
        f"{result['model']}: {result['workload']['num_requests']} requests at "
        f"{result['workload']['rate']}/s; 32 vs 1 stream: {result['streams']['ratio']:.1f}x"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    args = parse_args()
    from headrace.engine.runner.model_runner import ModelRunner

    model_cfg = ModelConfig(model=args.model, dtype=args.dtype, num_threads=args.num_threads)
    runner = ModelRunner(model_cfg, CacheConfig())
    vocab = runner.vocab_size
    warm = SchedulerConfig()
    run_open_loop(runner, warm, [Item(0.0, [min(1000, vocab // 2)] * 16, 4)])  # warm up
    items = make_workload(args, vocab)
    spec = (
        {}
        if args.num_speculative_tokens is None
        else {"num_speculative_tokens": args.num_speculative_tokens}
    )
    policies = {
        "one-at-a-time": SchedulerConfig(
            max_num_seqs=1, max_num_batched_tokens=args.max_prompt, **spec
        ),
        "static": SchedulerConfig(
            policy="static",
            static_batch_size=args.static_batch,
            static_wait_ms=args.static_wait_ms,
            max_num_seqs=max(args.static_batch, 1),
            max_num_batched_tokens=args.max_num_batched_tokens,
            **spec,
        ),
        "continuous": SchedulerConfig(
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            **spec,
        ),
    }
    result: dict[str, Any] = {
        "model": runner.model_name,
        "device": str(runner.device),
        "dtype": str(runner.dtype).removeprefix("torch."),
        "workload": {
            k: getattr(args, k)
            for k in (
                "num_requests",
                "rate",
                "min_prompt",
                "max_prompt",
                "min_output",
                "max_output",
                "seed",
            )
        },  # fmt: skip
        "policies": {},
    }
    for name, sched in policies.items():
        result["policies"][name] = run_open_loop(runner, sched, items)
        print(name, json.dumps(result["policies"][name]), flush=True)
    # Join wait while there is free capacity: continuous batching at a light load.
    light = argparse.Namespace(**{**vars(args), "rate": args.light_rate or args.rate / 4})
    light.num_requests = max(args.num_requests // 4, 1)
    result["light_load"] = {"rate": light.rate, "num_requests": light.num_requests}
    result["light_load"] |= run_open_loop(
        runner, policies["continuous"], make_workload(light, vocab)
    )
    print("continuous, light load", json.dumps(result["light_load"]), flush=True)
    one = run_closed_loop(runner, 1, args.stream_tokens, vocab, spec)
    many = run_closed_loop(runner, args.streams, args.stream_tokens, vocab, spec)
    result["streams"] = {
        "one": one,
        "many": many,
        "ratio": many["tokens_per_s"] / one["tokens_per_s"],
    }
    p = result["policies"]
    result["ratios"] = {
        "continuous_vs_static_throughput": p["continuous"]["output_tokens_per_s"]
        / p["static"]["output_tokens_per_s"],
        "continuous_vs_one_throughput": p["continuous"]["output_tokens_per_s"]
        / p["one-at-a-time"]["output_tokens_per_s"],
        "continuous_vs_static_ttft_p95": p["continuous"]["ttft_p95_s"] / p["static"]["ttft_p95_s"],
        "light_join_wait_p99_minus_step_p99_s": result["light_load"]["join_wait_p99_s"]
        - result["light_load"]["step_p99_s"],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2))
    plot(result, args.out.with_suffix(".png"))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
