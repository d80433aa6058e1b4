"""`headrace bench`: load-test an OpenAI-compatible server (or Headrace's /v1/generate).

Examples:
  headrace bench --url http://127.0.0.1:8000 --concurrency 1,4,16 --num-requests 64
  headrace bench --url http://127.0.0.1:8000 --rate 1,2,4 --duration 60 --workload mix --out out/
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any

from headrace.bench import BenchError
from headrace.bench.client import Target
from headrace.bench.loadgen import Bounds, run_level
from headrace.bench.stats import Slo
from headrace.bench.workloads import Tenant, Workload, load_tenants, parse_range


def add_target_arguments(parser: argparse.ArgumentParser, with_url: bool = True) -> None:
    g = parser.add_argument_group("server")
    if with_url:  # `plan` takes --url in a group of its own
        g.add_argument("--url", required=True, help="base URL, e.g. http://127.0.0.1:8000")
    g.add_argument(
        "--api",
        choices=("completions", "generate"),
        default="completions",
        help="/v1/completions (any OpenAI-compatible server) or Headrace's /v1/generate",
    )
    g.add_argument(
        "--model",
        help="model name to send (default: the first of /v1/models); several, comma-separated, "
        "are taken in turn (e.g. LoRA adapters over one base model)",
    )
    g.add_argument("--api-key", help="sent as 'Authorization: Bearer KEY'")
    g.add_argument(
        "--no-ignore-eos",
        action="store_true",
        help="do not send ignore_eos (outputs may then end before max_tokens)",
    )
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument(
        "--connection-per-request",
        action="store_true",
        help="open a new connection for every request (llama-server drops reused "
        "keep-alive connections under load)",
    )
    g.add_argument("--timeout", type=float, default=300.0, help="per request, seconds")


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("workload")
    g.add_argument(
        "--workload",
        choices=("fixed", "uniform", "mix"),
        default="fixed",
        help="fixed lengths, uniform ranges, or the realistic seeded mix",
    )
    g.add_argument(
        "--prompt-len",
        default="128",
        help="prompt words (about one token each): N, or LO:HI for uniform",
    )
    g.add_argument("--output-len", default="64", help="output tokens: N, or LO:HI for uniform")
    g.add_argument("--max-len", type=int, help="cap prompt + output (the model's context)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument(
        "--tenants",
        metavar="FILE",
        help="YAML/JSON: tenants: [{name, api_key, tier, share}] — requests are "
        "spread over the tenants by share, each sent with its key",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser)
    add_workload_arguments(parser)
    g = parser.add_argument_group("load")
    load = g.add_mutually_exclusive_group()
    load.add_argument("--rate", help="open loop: requests/s, or a sweep '1,2,4'")
    load.add_argument("--concurrency", help="closed loop: streams, or a sweep '1,4,16' (default 1)")
    g.add_argument(
        "--arrivals",
        choices=("poisson", "constant"),
        default="poisson",
        help="open-loop inter-arrival times",
    )
    g.add_argument("--num-requests", type=int, default=100, help="per level (0: no limit)")
    g.add_argument("--duration", type=float, help="seconds to keep sending, per level")
    g.add_argument(
        "--drain-timeout",
        type=float,
        default=60.0,
        help="seconds in-flight requests may take after sending stops",
    )
    g = parser.add_argument_group("report")
    g.add_argument("--slo-ttft", type=float, default=1.0, help="goodput: TTFT limit, seconds")
    g.add_argument("--slo-tpot", type=float, help="goodput: TPOT limit, seconds (default none)")
    g.add_argument("--out", metavar="DIR", help="write bench.json and PNG plots there")
    g.add_argument("--no-plots", action="store_true")
    g.add_argument(
        "--scrape-interval",
        type=float,
        default=0.5,
        help="seconds between /metrics scrapes (0: do not scrape)",
    )


def parse_levels(text: str, flag: str) -> list[float]:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise BenchError(f"{flag} needs at least one value, e.g. {flag} 1,2,4")
    try:
        levels = [float(p) for p in parts]
    except ValueError:
        raise BenchError(f"{flag} takes numbers separated by commas, got {text!r}") from None
    bad = [v for v in levels if not v > 0 or v == float("inf")]
    if bad:
        raise BenchError(f"{flag} values must be finite and > 0, got {bad[0]:g}")
    if flag == "--concurrency" and any(v != int(v) for v in levels):
        raise BenchError("--concurrency takes whole numbers of streams")
    return levels


def build_target(args: argparse.Namespace) -> Target:
    if not args.url.startswith(("http://", "https://")):
        raise BenchError(f"--url must start with http:// or https://, got {args.url!r}")
    if args.timeout <= 0:
        raise BenchError("--timeout must be > 0")
    return Target(
        url=args.url.rstrip("/"),
        api=args.api,
        model=args.model,
        api_key=args.api_key,
        ignore_eos=not args.no_ignore_eos,
        temperature=args.temperature,
        connection_per_request=args.connection_per_request,
        timeout=args.timeout,
    )


def build_workload(args: argparse.Namespace) -> Workload:
    tenants: tuple[Tenant, ...] = ()
    try:
        if args.tenants:
            tenants = load_tenants(args.tenants)
        return Workload(
            kind=args.workload,
            prompt_len=parse_range(args.prompt_len),
            output_len=parse_range(args.output_len),
            seed=args.seed,
            max_len=args.max_len,
            tenants=tenants,
        )
    except OSError as exc:
        raise BenchError(f"cannot read {args.tenants}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise BenchError(str(exc)) from None


def build_bounds(args: argparse.Namespace) -> Bounds:
    num = args.num_requests or None
    if num is not None and num < 0:
        raise BenchError("--num-requests must be >= 0")
    if args.duration is not None and not args.duration > 0:
        raise BenchError("--duration must be > 0")
    if num is None and args.duration is None:
        raise BenchError("give --num-requests or --duration, or the run never ends")
    if args.drain_timeout < 0:
        raise BenchError("--drain-timeout must be >= 0")
    return Bounds(num_requests=num, duration=args.duration, drain_timeout=args.drain_timeout)


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_bench(args))
    except BenchError as exc:
        print(f"headrace bench: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("headrace bench: interrupted", file=sys.stderr)
        return 130


async def _bench(args: argparse.Namespace) -> int:
    from headrace.bench.preflight import preflight
    from headrace.bench.report import Progress, bench_document, render, run_document

    mode, text = ("rate", args.rate) if args.rate is not None else ("concurrency", args.concurrency)
    levels = parse_levels(text or "1", f"--{mode}")
    target, workload, bounds = build_target(args), build_workload(args), build_bounds(args)
    slo = Slo(ttft=args.slo_ttft, tpot=args.slo_tpot)
    created = time.time()
    target = await preflight(target, workload.tenants[0] if workload.tenants else None)
    runs: list[dict[str, Any]] = []
    for i, level in enumerate(levels):
        label = f"[{i + 1}/{len(levels)}] {level:g} {'req/s' if mode == 'rate' else 'streams'}"
        progress = Progress(label, bounds.num_requests, bounds.duration)
        ticker = asyncio.create_task(progress.tick())
        try:
            result = await run_level(
                target,
                workload,
                mode,
                level,
                bounds,
                arrivals=args.arrivals,
                scrape_interval=args.scrape_interval or None,
                on_result=progress.update,
            )
        finally:
            ticker.cancel()
        progress.close()
        runs.append(run_document(result, slo))
    doc = bench_document(target, workload, mode, levels, bounds, args.arrivals, slo, runs, created)
    print(render(doc))
    if args.out:
        write_outputs(doc, args.out, plots=not args.no_plots)
    if all(r["summary"]["completed"] == 0 for r in runs):
        raise BenchError("no request succeeded; see the errors above")
    return 0


def write_outputs(doc: dict[str, Any], out_dir: str, plots: bool = True) -> list[str]:
    try:
        os.makedirs(out_dir, exist_ok=True)
        path = os.path.join(out_dir, "bench.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
        from headrace.bench.html_report import write_html

        paths = [path]
        if plots:
            from headrace.bench.plots import write_plots

            paths += write_plots(doc, out_dir)
        paths.append(write_html(doc, out_dir, [p for p in paths if p.endswith(".png")]))
    except OSError as exc:
        raise BenchError(f"cannot write to {out_dir}: {exc.strerror or exc}") from None
    print("wrote " + ", ".join(paths))
    return paths
