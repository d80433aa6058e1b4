"""Capacity planning: output tokens/s one replica sustains within the SLO, and how many replicas
a forecast peak needs.

A run meets the SLO when its TTFT p95 and TPOT p95 are within the limits given and at most
`max_error_share` of its requests failed (a server that sheds load with 429/503 must not look
fast). The replica count is `ceil(peak / per_replica * (1 + headroom))`.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

from headrace.bench.stats import Slo

PLAN_SCHEMA_ID = "headrace-plan/1"
WARMUP_CAVEAT = (
    "A new replica needs time to start (process start, loading and converting weights, first "
    "compilations) before it serves: scale on forecasts and keep the headroom for spikes, do not "
    "rely on adding replicas when a live spike arrives."
)


@dataclass(frozen=True)
class Point:
    """One measured load level, reduced to what the plan needs."""

    mode: str
    level: float
    output_tokens_per_s: float
    request_throughput: float
    ttft_p95: float | None
    tpot_p95: float | None
    requests: int
    failed: int

    @property
    def error_share(self) -> float:
        return self.failed / self.requests if self.requests else 1.0

    @classmethod
    def from_run(cls, run: dict[str, Any]) -> Point:
        s = run["summary"]
        return cls(
            mode=run["mode"],
            level=float(run["level"]),
            output_tokens_per_s=float(s["output_tokens_per_s"]),
            request_throughput=float(s["request_throughput"]),
            ttft_p95=s["ttft_s"]["p95"],
            tpot_p95=s["tpot_s"]["p95"],
            requests=int(s["requests"]),
            failed=int(s["failed"]),
        )


def meets(point: Point, slo: Slo, max_error_share: float = 0.01) -> bool:
    if point.requests == 0 or point.requests == point.failed:
        return False
    if point.error_share > max_error_share:
        return False
    if slo.ttft is not None and (point.ttft_p95 is None or point.ttft_p95 > slo.ttft):
        return False
    return not (slo.tpot is not None and point.tpot_p95 is not None and point.tpot_p95 > slo.tpot)


def best_point(points: list[Point], slo: Slo, max_error_share: float = 0.01) -> Point | None:
    """The passing point with the highest output tokens/s, or None when none passes."""
    passing = [p for p in points if meets(p, slo, max_error_share)]
    return max(passing, key=lambda p: p.output_tokens_per_s, default=None)


def replicas_needed(peak_tokens_per_s: float, per_replica: float, headroom: float) -> int:
    if per_replica <= 0:
        raise ValueError("tokens/s per replica must be > 0")
    if peak_tokens_per_s <= 0 or headroom < 0:
        raise ValueError("the peak must be > 0 and the headroom >= 0")
    # Round away float noise first: 2000 / 400 * 1.3 must give 7, not 8.
    return max(1, math.ceil(round(peak_tokens_per_s / per_replica * (1 + headroom), 9)))


Measure = Callable[[float], Awaitable[Point]]


async def bisect_rate(
    measure: Measure,
    slo: Slo,
    *,
    start_rate: float = 1.0,
    max_probes: int = 8,
    tolerance: float = 0.1,
    max_error_share: float = 0.01,
) -> list[Point]:
    """Finds the highest offered rate that meets the SLO with at most `max_probes` measurements:
    doubles (or halves) from `start_rate` until the SLO boundary is bracketed, then bisects until
    the bracket is narrower than `tolerance` (relative). Returns every probe, in order."""
    if start_rate <= 0 or max_probes < 1 or tolerance <= 0:
        raise ValueError("start rate and tolerance must be > 0, max probes >= 1")
    lo: float | None = None  # highest rate that met the SLO
    hi: float | None = None  # lowest rate that did not
    rate, probes = start_rate, []
    for _ in range(max_probes):
        point = await measure(rate)
        probes.append(point)
        if meets(point, slo, max_error_share):
            lo = rate if lo is None else max(lo, rate)
        else:
            hi = rate if hi is None else min(hi, rate)
        if hi is None:
            rate *= 2
        elif lo is None:
            rate /= 2
        elif hi / lo <= 1 + tolerance:
            break
        else:
            rate = (lo + hi) / 2
    return probes


@dataclass(frozen=True)
class Plan:
    slo_ttft_s: float | None
    slo_tpot_s: float | None
    max_error_share: float
    per_replica_tokens_per_s: float
    at_mode: str
    at_level: float
    peak_tokens_per_s: float | None
    headroom: float
    replicas: int | None
    source: str

    def as_dict(self, points: list[Point], slo: Slo) -> dict[str, Any]:
        table = [dict(asdict(p), meets_slo=meets(p, slo, self.max_error_share)) for p in points]
        return {"schema": PLAN_SCHEMA_ID, **asdict(self), "points": table, "caveat": WARMUP_CAVEAT}


def make_plan(
    points: list[Point],
    slo: Slo,
    peak_tokens_per_s: float | None,
    headroom: float,
    source: str,
    max_error_share: float = 0.01,
) -> Plan | None:
    """None when no measured point meets the SLO."""
    best = best_point(points, slo, max_error_share)
    if best is None:
        return None
    replicas = None
    if peak_tokens_per_s is not None:
        replicas = replicas_needed(peak_tokens_per_s, best.output_tokens_per_s, headroom)
    return Plan(
        slo_ttft_s=slo.ttft,
        slo_tpot_s=slo.tpot,
        max_error_share=max_error_share,
        per_replica_tokens_per_s=best.output_tokens_per_s,
        at_mode=best.mode,
        at_level=best.level,
        peak_tokens_per_s=peak_tokens_per_s,
        headroom=headroom,
        replicas=replicas,
        source=source,
    )


def render_plan(plan: Plan, points: list[Point], slo: Slo) -> str:
    from headrace.bench.report import format_table

    unit = "req/s" if plan.at_mode == "rate" else "streams"
    rows = [
        [
            f"{p.level:g} {'req/s' if p.mode == 'rate' else 'streams'}",
            f"{p.output_tokens_per_s:.1f}",
            _ms(p.ttft_p95),
            _ms(p.tpot_p95),
            f"{p.failed}/{p.requests}",
            "yes" if meets(p, slo, plan.max_error_share) else "no",
        ]
        for p in points
    ]
    header = ("load", "out tok/s", "TTFT p95 ms", "TPOT p95 ms", "failed", "meets SLO")
    lines = [
        f"measured ({plan.source}); SLO: TTFT p95 <= {_limit(plan.slo_ttft_s)}, "
        f"TPOT p95 <= {_limit(plan.slo_tpot_s)}, errors <= {plan.max_error_share:.0%}",
        format_table(rows, header),
        "",
        f"per replica: {plan.per_replica_tokens_per_s:.1f} output tokens/s within the SLO "
        f"(at {plan.at_level:g} {unit})",
    ]
    if plan.replicas is not None and plan.peak_tokens_per_s is not None:
        lines.append(
            f"replicas = ceil({plan.peak_tokens_per_s:g} / {plan.per_replica_tokens_per_s:.1f} "
            f"x (1 + {plan.headroom:g})) = {plan.replicas}"
        )
    lines += ["", f"note: {WARMUP_CAVEAT}"]
    return "\n".join(lines)


def _limit(seconds: float | None) -> str:
    return "(no limit)" if seconds is None else f"{seconds:g} s"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"
