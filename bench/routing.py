"""Routing benchmark: least-load vs round-robin vs power-of-two, and replicas vs threads.

One run starts `headrace serve` on 127.0.0.1 four times, with the same model and a skewed
workload (most prompts short, a few long — a long prefill sits in front of every short request
that lands behind it):

1. 2 replicas x 1 thread: a closed loop of `--concurrency` streams measures output tokens/s
   and the capacity in requests/s.
2. Poisson arrivals at `--load` x that capacity, on a fresh 2 x 1 server per policy
   (least-load, round-robin, power-of-two; `--order` sets the order).
3. 1 replica x 2 threads: the same closed loop, output tokens/s.

Reports TTFT p50/p95/p99 (all requests, short ones, long ones) per policy and its ratio to
least-load, and output tokens/s of 2x1 vs 1x2. Prints JSON; writes JSON and a PNG.

    .venv/bin/python bench/routing.py                               # Gemma 3 270M
    .venv/bin/python bench/routing.py --num-requests 40 --closed-requests 24 --long-share 0.15
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from headrace.bench.client import Target
from headrace.bench.loadgen import Bounds, LevelRun, run_level
from headrace.bench.local import serving
from headrace.bench.stats import RequestResult, percentile
from headrace.bench.workloads import Workload

POLICIES = ("least-load", "round-robin", "power-of-two")


@dataclass(frozen=True)
class Skewed(Workload):
    """`long_share` of the requests have a long prompt, the rest a short one."""

    long_share: float = 0.1
    long_prompt: tuple[int, int] = (600, 900)

    def _lengths(self, rng: random.Random) -> tuple[str, int, int]:
        output = rng.randint(*self.output_len)
        if rng.random() < self.long_share:
            return "long", rng.randint(*self.long_prompt), output
        return "short", rng.randint(*self.prompt_len), output

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "long_share": self.long_share,
                "long_prompt": list(self.long_prompt)}  # fmt: skip


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="GGUF file or HF directory (default: Gemma 3)")
    p.add_argument("--num-requests", type=int, default=120, help="open loop, per policy")
    p.add_argument("--load", type=float, default=0.7, help="offered load, share of capacity")
    p.add_argument("--concurrency", type=int, default=16, help="closed loop streams")
    p.add_argument("--closed-requests", type=int, default=64, help="closed loop requests")
    p.add_argument("--short-prompt", default="16:64", help="words, lo:hi")
    p.add_argument("--long-prompt", default="600:900", help="words, lo:hi")
    p.add_argument("--long-share", type=float, default=0.1)
    p.add_argument("--output", default="16:64", help="tokens, lo:hi")
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--order", default=",".join(POLICIES), help="policies, in run order")
    p.add_argument("--server-arg", action="append", default=[], help="extra `serve` flag")
    p.add_argument("--out", type=Path, default=Path("bench/out/routing"))
    return p.parse_args()


def lo_hi(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition(":")
    return int(lo), int(hi or lo)


def workload(args: argparse.Namespace, seed: int) -> Skewed:
    return Skewed(
        kind="uniform", prompt_len=lo_hi(args.short_prompt), output_len=lo_hi(args.output),
        seed=seed, long_share=args.long_share, long_prompt=lo_hi(args.long_prompt),
    )  # fmt: skip


@contextlib.contextmanager
def server(args: argparse.Namespace, workdir: Path, *flags: str) -> Iterator[str]:
    """`headrace serve` with `flags`, until the block ends; yields its URL."""
    flags_ = [
        "--max-num-seqs", str(args.max_num_seqs), "--log-level", "warning",
        *flags, *args.server_arg,
    ]  # fmt: skip
    if args.model:
        flags_ += ["--model", args.model]
    with serving(flags_, workdir) as url:
        yield url


def routed(url: str) -> dict[str, int]:
    data = httpx.get(url + "/v1/stats", timeout=10).json()
    return {r["name"]: r["routed"] for m in data["models"].values() for r in m.get("replicas", [])}


def output_tokens(run: LevelRun) -> int:
    return sum(r.output_tokens for r in run.results if r.ok)


def ttft(results: list[RequestResult], kind: str | None = None) -> dict[str, float | None]:
    values = [r.ttft for r in results if r.ok and r.ttft is not None and kind in (None, r.kind)]
    return {f"p{q}_ms": _ms(percentile(values, q)) for q in (50, 95, 99)}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


async def warm_up(url: str) -> None:
    """A few requests first, so that no replica's first-call costs land in a measurement."""
    wl = Workload(kind="fixed", prompt_len=(32, 32), output_len=(8, 8), seed=12345)
    await run_level(Target(url), wl, "concurrency", 4, Bounds(num_requests=8),
                    scrape_interval=None)  # fmt: skip


async def closed(url: str, args: argparse.Namespace) -> dict[str, Any]:
    wl = workload(args, args.seed + 1)
    bounds = Bounds(num_requests=args.closed_requests, drain_timeout=300)
    run = await run_level(Target(url), wl, "concurrency", args.concurrency, bounds,
                          scrape_interval=None)  # fmt: skip
    ok = [r for r in run.results if r.ok]
    return {
        "requests": len(run.results), "ok": len(ok), "duration_s": round(run.duration_s, 2),
        "output_tokens_per_s": round(output_tokens(run) / run.duration_s, 1),
        "requests_per_s": round(len(ok) / run.duration_s, 3),
    }  # fmt: skip


async def open_loop(url: str, args: argparse.Namespace, rate: float) -> dict[str, Any]:
    wl = workload(args, args.seed)
    before = routed(url)
    bounds = Bounds(num_requests=args.num_requests, drain_timeout=300)
    run = await run_level(Target(url), wl, "rate", rate, bounds, scrape_interval=None)
    results = run.results  # each carries its kind: short or long
    after = routed(url)
    return {
        "requests": len(results), "ok": sum(r.ok for r in results),
        "duration_s": round(run.duration_s, 2),
        "ttft": ttft(results), "ttft_short": ttft(results, "short"),
        "ttft_long": ttft(results, "long"),
        "output_tokens_per_s": round(output_tokens(run) / run.duration_s, 1),
        "routed": {k: after[k] - before.get(k, 0) for k in after},
    }  # fmt: skip


async def bench(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    two = ("--replicas", "2", "--num-threads", "1")
    policies: dict[str, Any] = {}
    with server(args, workdir, *two, "--routing", "least-load") as url:
        await warm_up(url)
        two_by_one = await closed(url, args)
    rate = round(args.load * two_by_one["requests_per_s"], 3)
    for policy in args.order.split(","):  # each on a fresh server, the same arrivals
        with server(args, workdir, *two, "--routing", policy) as url:
            await warm_up(url)
            policies[policy] = await open_loop(url, args, rate)
    with server(args, workdir, "--replicas", "1", "--num-threads", "2") as url:
        await warm_up(url)
        one_by_two = await closed(url, args)
    base = policies.get("least-load", {}).get("ttft", {}).get("p95_ms")
    return {
        "bench": "routing",
        "model": args.model or "gemma-3-270m (embedded)",
        "workload": workload(args, args.seed).describe(),
        "offered_rate_rps": rate,
        "load": args.load,
        "policies": policies,
        "ttft_p95_vs_least_load": {
            p: _ratio(v["ttft"]["p95_ms"], base) for p, v in policies.items()
        },
        "replicas_vs_threads": {
            "2_replicas_x_1_thread": two_by_one,
            "1_replica_x_2_threads": one_by_two,
            "throughput_ratio": _ratio(
                two_by_one["output_tokens_per_s"], one_by_two["output_tokens_per_s"]
            ),
        },
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 3)


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    pols = report["policies"]
    x = range(len(pols))
    for i, (key, label) in enumerate((("ttft", "all"), ("ttft_short", "short prompts"))):
        values = [v[key]["p95_ms"] or 0 for v in pols.values()]
        ax1.bar([j + i * 0.4 for j in x], values, width=0.4, label=label)
    ax1.set_xticks([j + 0.2 for j in x], list(pols))
    ax1.set_ylabel("TTFT p95 (ms)")
    ax1.set_title(f"2 replicas, Poisson {report['offered_rate_rps']} req/s, skewed prompts")
    ax1.legend()
    rvt = report["replicas_vs_threads"]
    ax2.bar(["2 replicas x 1 thread", "1 replica x 2 threads"],
            [rvt["2_replicas_x_1_thread"]["output_tokens_per_s"],
             rvt["1_replica_x_2_threads"]["output_tokens_per_s"]])  # fmt: skip
    ax2.set_ylabel("output tokens/s (closed loop)")
    ax2.set_title("replicas vs threads")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="headrace-routing-") as tmp:
        report = asyncio.run(bench(args, Path(tmp)))
    (args.out / "routing.json").write_text(json.dumps(report, indent=2))
    plot(report, args.out / "routing.png")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
