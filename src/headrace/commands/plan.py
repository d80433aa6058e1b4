"""`headrace plan`: size a replica pool from measured throughput within an SLO.

From a bench JSON:   headrace plan --from out/bench.json --peak-tokens-per-s 2000
By measuring a URL:  headrace plan --url http://127.0.0.1:8000 --peak-tokens-per-s 2000
(bisection over the offered request rate, at most --max-probes bench runs)
A schedule:          headrace plan --from out/bench.json --demand-trace demand.csv
(replicas hour by hour for the next --schedule-hours, from the autoscaler's forecast)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import asdict
from typing import Any

from headrace.bench import BenchError
from headrace.bench.loadgen import Bounds, run_level
from headrace.bench.plan import Point, bisect_rate, make_plan, render_plan
from headrace.bench.schedule import load_trace, render_schedule, schedule
from headrace.bench.stats import Slo
from headrace.commands.bench import add_target_arguments, add_workload_arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--from", dest="source", metavar="FILE", help="a `headrace bench` JSON file")
    src.add_argument("--url", help="measure this server (open-loop bisection over the rate)")
    g = parser.add_argument_group("plan")
    g.add_argument("--peak-tokens-per-s", type=float, help="forecast peak output tokens/s")
    g.add_argument("--headroom", type=float, default=0.3, help="spare share on top (0.3: 30%%)")
    g.add_argument("--slo-ttft", type=float, default=1.0, help="TTFT p95 limit, seconds")
    g.add_argument("--slo-tpot", type=float, help="TPOT p95 limit, seconds (default none)")
    g.add_argument(
        "--max-error-share",
        type=float,
        default=0.01,
        help="a level with more failed requests than this does not meet the SLO",
    )
    g.add_argument(
        "--demand-trace", metavar="FILE",
        help="recorded demand (CSV or JSON of timestamp, tokens_per_s): print a replica "
        "schedule, hour by hour, from its forecast",
    )  # fmt: skip
    g.add_argument("--schedule-hours", type=int, default=24, help="hours the schedule covers")
    g.add_argument("--start-s", type=float, help="replica start time, for the schedule's note")
    g.add_argument("--out", metavar="DIR", help="write plan.json (and the probes' bench.json)")
    g = parser.add_argument_group("measuring (with --url)")
    g.add_argument("--start-rate", type=float, default=1.0, help="first probe, requests/s")
    g.add_argument("--max-probes", type=int, default=8)
    g.add_argument(
        "--tolerance",
        type=float,
        default=0.1,
        help="stop when the bracket around the limit is this narrow (relative)",
    )
    g.add_argument("--probe-duration", type=float, default=30.0, help="seconds of arrivals")
    g.add_argument("--probe-requests", type=int, default=500, help="cap per probe")
    g.add_argument("--arrivals", choices=("poisson", "constant"), default="poisson")
    g.add_argument("--drain-timeout", type=float, default=60.0)
    add_target_arguments(parser, with_url=False)
    add_workload_arguments(parser)


def run(args: argparse.Namespace) -> int:
    try:
        _check(args)
        return asyncio.run(_plan(args))
    except BenchError as exc:
        print(f"headrace plan: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("headrace plan: interrupted", file=sys.stderr)
        return 130


def _check(args: argparse.Namespace) -> None:
    if args.peak_tokens_per_s is not None and not args.peak_tokens_per_s > 0:
        raise BenchError("--peak-tokens-per-s must be > 0")
    if args.headroom < 0:
        raise BenchError("--headroom must be >= 0")
    if args.start_rate <= 0 or args.max_probes < 1 or args.tolerance <= 0:
        raise BenchError("--start-rate and --tolerance must be > 0, --max-probes >= 1")
    if args.probe_duration <= 0 or args.probe_requests < 1:
        raise BenchError("--probe-duration must be > 0 and --probe-requests >= 1")
    if not 1 <= args.schedule_hours <= 24 * 14:
        raise BenchError("--schedule-hours must be in 1..336")


async def _plan(args: argparse.Namespace) -> int:
    slo = Slo(ttft=args.slo_ttft, tpot=args.slo_tpot)
    if args.source:
        points, source = _points_from_file(args.source), args.source
    else:
        points, source = await _measure(args, slo), f"bisection against {args.url}"
    plan = make_plan(
        points, slo, args.peak_tokens_per_s, args.headroom, source, args.max_error_share
    )
    if plan is None:
        lowest = min((p.level for p in points), default=None)
        raise BenchError(
            f"no measured load met the SLO (lowest tried: {lowest}); "
            "relax the SLO or measure lower loads"
        )
    print(render_plan(plan, points, slo))
    doc = plan.as_dict(points, slo)
    if args.demand_trace:
        trace = load_trace(args.demand_trace)
        per_replica, headroom = plan.per_replica_tokens_per_s, plan.headroom
        slots, seasonal = schedule(trace, per_replica, headroom, args.schedule_hours)
        print(render_schedule(slots, seasonal, args.start_s))
        doc["schedule"] = [asdict(s) for s in slots]
    if args.out:
        _write(os.path.join(args.out, "plan.json"), doc)
    return 0


def _points_from_file(path: str) -> list[Point]:
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        points = [Point.from_run(run) for run in doc["runs"]]
    except OSError as exc:
        raise BenchError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise BenchError(f"{path} is not a headrace bench JSON file ({exc!r})") from None
    if not points:
        raise BenchError(f"{path} holds no runs")
    return points


async def _measure(args: argparse.Namespace, slo: Slo) -> list[Point]:
    from headrace.bench.preflight import preflight
    from headrace.bench.report import bench_document, run_document
    from headrace.commands.bench import build_target, build_workload, write_outputs

    target, workload = build_target(args), build_workload(args)
    target = await preflight(target, workload.tenants[0] if workload.tenants else None)
    bounds = Bounds(args.probe_requests, args.probe_duration, args.drain_timeout)
    runs: list[dict[str, Any]] = []
    created = time.time()

    async def measure(rate: float) -> Point:
        result = await run_level(target, workload, "rate", rate, bounds, arrivals=args.arrivals)
        runs.append(run_document(result, slo))
        point = Point.from_run(runs[-1])
        ttft = "-" if point.ttft_p95 is None else f"{point.ttft_p95:.3f} s"
        print(
            f"probe {len(runs)}: {rate:g} req/s -> {point.output_tokens_per_s:.1f} tok/s, "
            f"TTFT p95 {ttft}, failed {point.failed}/{point.requests}",
            file=sys.stderr,
        )
        return point

    points = await bisect_rate(
        measure,
        slo,
        start_rate=args.start_rate,
        max_probes=args.max_probes,
        tolerance=args.tolerance,
        max_error_share=args.max_error_share,
    )
    if args.out:
        levels = [p.level for p in points]
        doc = bench_document(
            target, workload, "rate", levels, bounds, args.arrivals, slo, runs, created
        )
        write_outputs(doc, args.out, plots=True)
    return points


def _write(path: str, doc: dict[str, Any]) -> None:
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
    except OSError as exc:
        raise BenchError(f"cannot write {path}: {exc.strerror or exc}") from None
    print(f"wrote {path}")
