"""The autoscaler on a synthetic day of diurnal traffic with bursts, against a reactive
(queue-based) policy: replicas over time, SLO violations, replica-hours.

Calibration (measured here unless given): the output tokens/s one replica sustains with
`--streams` concurrent greedy streams, and the time from asking for a replica to its model
being loaded (an engine-core process started as `--autoscale` starts one). The traffic is two
working days: 15% of the peak at night, a steep morning rise to `--peak-replicas` replicas'
worth, a slow evening fall, plus random bursts (5-25 minutes, 1.3-2.2x, `--bursts` a day); the
first day is history (the forecaster learns its profile from it), the second is scored.

The model is fluid: a replica asked for serves `start` seconds later; demand beyond capacity
joins a backlog; a second is an SLO violation when the backlog would take more than
`--slo-wait-s` to clear. Both policies see what a server sees (tokens/s delivered, whether
requests queue, replicas serving or starting), have the same bounds and start time:

- `forecast`: headrace's `Autoscaler` (router/autoscaler.py), fed every `--interval-s`.
- `reactive`: as Ray Serve's and KServe's: desired = ceil(replicas x load / target), load =
  delivered + backlog drain rate over capacity, target 0.8; up after 30 s above, down after
  600 s below.

    .venv/bin/python bench/autoscale_sim.py                      # measure with Gemma 3 270M
    .venv/bin/python bench/autoscale_sim.py --replica-tps 180 --start-s 9   # no measuring
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headrace.config import AutoscaleConfig, CacheConfig, ModelConfig, SchedulerConfig
from headrace.router.autoscaler import Autoscaler, Sample

DAY_S = 86_400
DT = 10.0  # simulation step, seconds


# -- calibration --------------------------------------------------------------------------


async def measure(model: str | None, streams: int, tokens: int) -> tuple[float, float]:
    """(output tokens/s of one replica at `streams` concurrent streams, its start time)."""
    from headrace.engine.frontend.async_engine import AsyncEngine
    from headrace.request import SamplingParams

    t0 = time.monotonic()
    engine = await AsyncEngine.start(ModelConfig(model=model), CacheConfig(), SchedulerConfig())
    start_s = time.monotonic() - t0
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)

    async def one(i: int) -> int:
        prompt = f"Request {i}: tell me about the history of the river and its mills."
        ids = engine.tokenizer.encode(prompt)
        return sum([len(c.token_ids) async for c in engine.generate(f"r{i}", ids, params)])

    try:
        await one(-1)  # warm up
        t1 = time.monotonic()
        produced = sum(await asyncio.gather(*(one(i) for i in range(streams))))
        return produced / (time.monotonic() - t1), start_s
    finally:
        await engine.close()


# -- traffic ------------------------------------------------------------------------------


def demand_trace(
    peak_tps: float, seed: int, bursts_per_day: int, days: int = 2
) -> tuple[list[float], list[bool]]:
    """Tokens/s every DT seconds — a working day: 15% of the peak at night, a steep morning
    rise (10% to 90% of it between 07:45 and 09:15), a slow evening fall, random bursts —
    and whether each step is in a burst."""
    rng = random.Random(seed)
    bursts = []
    for day in range(days):
        for _ in range(bursts_per_day):
            start = day * DAY_S + rng.uniform(6, 23) * 3600
            bursts.append((start, start + rng.uniform(300, 1500), rng.uniform(1.3, 2.2)))
    out, in_burst = [], []
    for i in range(int(days * DAY_S / DT)):
        t = i * DT
        hour = t % DAY_S / 3600
        rise = 1 / (1 + math.exp(-(hour - 8.5) / 0.34))
        fall = 1 / (1 + math.exp((hour - 20.0) / 0.8))
        base = peak_tps * (0.15 + 0.85 * rise * fall)
        factor = max((f for s, e, f in bursts if s <= t < e), default=1.0)
        out.append(base * factor * (1 + rng.gauss(0, 0.03)))
        in_burst.append(factor > 1.0)
    return out, in_burst


# -- policies -----------------------------------------------------------------------------


class Reactive:
    """Queue/utilisation-based, as today's serving autoscalers."""

    def __init__(self, lo: int, hi: int, target: float = 0.8, up_s: float = 30.0,
                 down_s: float = 600.0) -> None:  # fmt: skip
        self.lo, self.hi, self.target_util = lo, hi, target
        self.up_s, self.down_s = up_s, down_s
        self._above: float | None = None
        self._below: float | None = None

    def decide(self, now: float, current: int, load: float) -> int:
        want = min(max(math.ceil(current * load / self.target_util - 1e-9), self.lo), self.hi)
        if want > current:
            self._below, self._above = None, self._above if self._above is not None else now
            return want if now - self._above >= self.up_s else current
        self._above = None
        if want < current:
            self._below = self._below if self._below is not None else now
            return want if now - self._below >= self.down_s else current
        self._below = None
        return current


@dataclass
class Run:
    name: str
    replicas: list[int] = field(default_factory=list)  # serving + starting, each step
    serving: list[int] = field(default_factory=list)
    violated: list[bool] = field(default_factory=list)


def simulate(
    name: str, trace: list[float], tps: float, start_s: float, lo: int, hi: int,
    slo_wait_s: float, decide: Callable[..., int], every_s: float,
) -> Run:  # fmt: skip
    """decide(now, replicas, delivered tokens/s, queued, serving, backlog) -> replicas."""
    run, backlog, ready = Run(name), 0.0, [0.0] * lo  # when each replica serves
    delivered_sum, queued_all, steps = 0.0, True, 0
    for i, demand in enumerate(trace):
        now = i * DT
        serving = sum(1 for r in ready if r <= now)
        capacity = serving * tps
        offered = demand + backlog / DT
        delivered = min(offered, capacity)
        backlog = max(backlog + (demand - capacity) * DT, 0.0)
        delivered_sum, steps = delivered_sum + delivered, steps + 1
        queued_all = queued_all and backlog > 0
        if (i + 1) % round(every_s / DT) == 0:
            want = decide(now, len(ready), delivered_sum / steps, queued_all, serving, backlog)
            if want > len(ready):
                ready += [now + start_s] * (want - len(ready))
            elif want < len(ready):
                ready = sorted(ready)[: max(want, 1)]  # drain the started-last first
            delivered_sum, queued_all, steps = 0.0, True, 0
        run.replicas.append(len(ready))
        run.serving.append(serving)
        run.violated.append(capacity == 0 or backlog / capacity > slo_wait_s)
    return run


def forecast_policy(cfg: AutoscaleConfig, tps: float) -> Callable[..., int]:
    clock = {"now": 0.0}
    policy = Autoscaler(cfg, lambda: clock["now"])

    def decide(
        now: float, current: int, delivered: float, queued: bool, serving: int, backlog: float
    ) -> int:
        clock["now"] = now
        policy.observe(Sample(delivered, serving, queued, backlog))
        return policy.target(current)

    return decide


def reactive_policy(lo: int, hi: int, tps: float) -> Callable[..., int]:
    policy = Reactive(lo, hi)

    def decide(
        now: float, current: int, delivered: float, queued: bool, serving: int, backlog: float
    ) -> int:
        load = (delivered + backlog / 60.0) / (serving * tps) if serving else 1.0
        return policy.decide(now, current, load)

    return decide


def score(run: Run, scored_from: int, in_burst: list[bool]) -> dict[str, Any]:
    reps, bad = run.replicas[scored_from:], run.violated[scored_from:]
    calm = [v for v, b in zip(bad, in_burst[scored_from:], strict=True) if v and not b]
    return {
        "replica_hours": round(sum(reps) * DT / 3600, 1),
        "slo_violation_minutes": round(sum(bad) * DT / 60, 1),
        "slo_violation_share": round(sum(bad) / len(bad), 4),
        "slo_violation_minutes_outside_bursts": round(len(calm) * DT / 60, 1),
        "max_replicas": max(reps), "min_replicas": min(reps),
        "scale_events": sum(1 for a, b in zip(reps, reps[1:], strict=False) if a != b),
    }  # fmt: skip


def plot(trace: list[float], runs: list[Run], tps: float, scored_from: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hours = [(i - scored_from) * DT / 3600 for i in range(scored_from, len(trace))]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    top.plot(hours, [d / tps for d in trace[scored_from:]], color="0.5", lw=0.8,
             label="demand (replicas' worth)")  # fmt: skip
    for run, color in zip(runs, ("tab:blue", "tab:orange"), strict=True):
        top.step(hours, run.serving[scored_from:], color=color, lw=1.2, where="post",
                 label=f"{run.name}: replicas serving")  # fmt: skip
        bad = [h for h, v in zip(hours, run.violated[scored_from:], strict=True) if v]
        bottom.scatter(bad, [run.name] * len(bad), s=4, color=color)
    top.set_ylabel("replicas")
    top.legend(loc="upper left")
    top.set_title("Autoscaling a synthetic day: forecast vs reactive")
    bottom.set_ylabel("SLO violated")
    bottom.set_xlabel("hour of the scored day")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="model to measure (default: Gemma 3 270M)")
    ap.add_argument("--replica-tps", type=float, help="skip measuring: tokens/s per replica")
    ap.add_argument("--start-s", type=float, help="skip measuring: replica start time, s")
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--peak-replicas", type=float, default=8.0)
    ap.add_argument("--bursts", type=int, default=8, help="random bursts per day")
    ap.add_argument("--bounds", default="1:24")
    ap.add_argument("--slo-wait-s", type=float, default=5.0)
    ap.add_argument("--interval-s", type=float, default=60.0)
    ap.add_argument("--headroom", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="docs/img/autoscale_sim")
    args = ap.parse_args()
    measured = {}
    if args.replica_tps is None or args.start_s is None:
        tps, start_s = asyncio.run(measure(args.model, args.streams, args.tokens))
        measured = {"replica_tokens_per_s": round(tps, 1), "start_s": round(start_s, 2)}
    tps = args.replica_tps or measured["replica_tokens_per_s"]
    start_s = args.start_s if args.start_s is not None else measured["start_s"]
    lo, hi = (int(x) for x in args.bounds.split(":"))
    trace, in_burst = demand_trace(args.peak_replicas * tps, args.seed, args.bursts)
    cfg = AutoscaleConfig(
        autoscale=args.bounds, autoscale_replica_tokens_per_s=tps,
        autoscale_headroom=args.headroom, autoscale_start_s=start_s,
        autoscale_interval_s=args.interval_s, autoscale_horizon_s=300.0,
        autoscale_cooldown_s=900.0,
    )  # fmt: skip
    common = (trace, tps, start_s, lo, hi, args.slo_wait_s)
    runs = [
        simulate("forecast", *common, forecast_policy(cfg, tps), args.interval_s),
        simulate("reactive", *common, reactive_policy(lo, hi, tps), args.interval_s),
    ]
    scored_from = int(DAY_S / DT)
    oracle = sum(math.ceil(d / tps) for d in trace[scored_from:]) * DT / 3600
    result = {
        "calibration": {"measured": measured, "replica_tokens_per_s": tps, "start_s": start_s,
                        "model": args.model or "Gemma 3 270M"},
        "traffic": {"peak_replicas": args.peak_replicas, "seed": args.seed,
                    "bursts_per_day": args.bursts},
        "slo_wait_s": args.slo_wait_s, "bounds": args.bounds,
        "oracle_replica_hours": round(oracle, 1),
        "policies": {run.name: score(run, scored_from, in_burst) for run in runs},
    }  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    plot(trace, runs, tps, scored_from, out.with_suffix(".png"))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
