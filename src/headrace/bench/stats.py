"""Statistics of a benchmark run: percentiles, goodput and per-group summaries.

Definitions (the same as vLLM's `benchmark_serving` so numbers compare):
- TTFT: request sent -> first non-empty piece of text received.
- TPOT: (end-to-end - TTFT) / (output tokens - 1), per request, for requests with > 1 token.
- ITL: gaps between successive streamed pieces of text, pooled over all requests.
- Goodput: requests that succeeded and met every SLO given (TTFT and TPOT), as a share of all
  requests sent and as a rate per second of the run's duration.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

PERCENTILES = (50, 95, 99)


@dataclass
class RequestResult:
    """What happened to one benchmark request. Times are seconds; `start` is relative to the
    run's start."""

    index: int
    start: float
    ok: bool
    status: int | None = None
    error: str | None = None
    message: str | None = None
    ttft: float | None = None
    e2e: float | None = None
    output_tokens: int = 0
    prompt_tokens: int | None = None
    tokens_from_usage: bool = False
    itl: list[float] = field(default_factory=list)
    tenant: str | None = None
    tier: str | None = None
    kind: str = ""
    max_tokens: int = 0
    text: str = ""  # the generated text (multi-turn workloads send it back)
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens, if reported

    @property
    def tpot(self) -> float | None:
        if not self.ok or self.ttft is None or self.e2e is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


@dataclass(frozen=True)
class Slo:
    ttft: float | None = None  # seconds
    tpot: float | None = None  # seconds

    def met_by(self, r: RequestResult) -> bool:
        if not r.ok:
            return False
        if self.ttft is not None and (r.ttft is None or r.ttft > self.ttft):
            return False
        tpot = r.tpot
        return not (self.tpot is not None and tpot is not None and tpot > self.tpot)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation between closest ranks (numpy's
    default method); None for no values."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within [0, 100], got {q}")
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def distribution(values: Sequence[float]) -> dict[str, float | int | None]:
    """Count, mean, min, max and the p50 / p95 / p99 of `values`."""
    out: dict[str, float | int | None] = {
        "count": len(values),
        "mean": sum(values) / len(values) if values else None,
        "min": min(values) if values else None,
        "max": max(values) if values else None,
    }
    for q in PERCENTILES:
        out[f"p{q}"] = percentile(values, q)
    return out


def goodput(results: Sequence[RequestResult], slo: Slo, duration_s: float) -> dict[str, object]:
    good = sum(1 for r in results if slo.met_by(r))
    return {
        "slo_ttft_s": slo.ttft,
        "slo_tpot_s": slo.tpot,
        "requests": good,
        "share": good / len(results) if results else 0.0,
        "rate_per_s": good / duration_s if duration_s > 0 else 0.0,
    }


def error_counts(results: Iterable[RequestResult]) -> dict[str, dict[str, int]]:
    """Failed requests by HTTP status (`"no_response"` when none came: connection refused,
    timeout, cancelled) and by error type."""
    failed = [r for r in results if not r.ok]
    by_status = Counter("no_response" if r.status is None else str(r.status) for r in failed)
    by_type = Counter(r.error or "unknown" for r in failed)
    return {"by_status": dict(sorted(by_status.items())), "by_type": dict(sorted(by_type.items()))}


def summarize(results: Sequence[RequestResult], duration_s: float, slo: Slo) -> dict[str, object]:
    """The summary of one run (or one tenant's / tier's part of it)."""
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    prompt_tokens = sum(r.prompt_tokens or 0 for r in ok)
    per_s = (lambda x: x / duration_s) if duration_s > 0 else (lambda x: 0.0)
    return {
        "requests": len(results),
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "duration_s": duration_s,
        "request_throughput": per_s(len(ok)),
        "output_tokens": out_tokens,
        "prompt_tokens": prompt_tokens,
        "output_tokens_per_s": per_s(out_tokens),
        "total_tokens_per_s": per_s(out_tokens + prompt_tokens),
        "tokens_from_usage": sum(1 for r in ok if r.tokens_from_usage),
        "ttft_s": distribution([r.ttft for r in ok if r.ttft is not None]),
        "tpot_s": distribution([t for r in ok if (t := r.tpot) is not None]),
        "itl_s": distribution([gap for r in ok for gap in r.itl]),
        "e2e_s": distribution([r.e2e for r in ok if r.e2e is not None]),
        "goodput": goodput(results, slo, duration_s),
        "errors": error_counts(results),
    }


def summarize_groups(
    results: Sequence[RequestResult], duration_s: float, slo: Slo, key: str
) -> dict[str, dict[str, object]]:
    """Summaries per tenant (`key="tenant"`) or per tier; empty when no request has one."""
    groups: dict[str, list[RequestResult]] = {}
    for r in results:
        name = getattr(r, key)
        if name is not None:
            groups.setdefault(name, []).append(r)
    return {name: summarize(rs, duration_s, slo) for name, rs in sorted(groups.items())}
