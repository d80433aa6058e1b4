"""The last seconds of finished requests, summed per tenant for the dashboard.

Prometheus histograms cannot give a tenant's TTFT percentiles (tenant is not a label of the
latency histograms, on purpose: a label per tenant would multiply every bucket), so the
dashboard keeps its own short window: one small record per finished request, dropped after
`span_s`, capped at `max_requests` so that a flood cannot grow it. Summaries are computed only
when someone asks (the page polls once a second), never on the request path.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

GOOD_REASONS = ("stop", "length")


@dataclass(frozen=True)
class Finished:
    """One finished request as the window keeps it."""

    at: float  # monotonic seconds
    model: str
    tenant: str
    tier: str
    weight: float
    ttft: float | None
    tpot: float | None  # mean seconds per output token after the first
    tokens: int  # prompt + completion
    finish_reason: str


@dataclass(frozen=True)
class SloTargets:
    ttft_s: float = 1.0
    tpot_s: float = 0.1

    def met_by(self, r: Finished) -> bool:
        if r.finish_reason not in GOOD_REASONS or r.ttft is None or r.ttft > self.ttft_s:
            return False
        return r.tpot is None or r.tpot <= self.tpot_s


class RequestWindow:
    def __init__(self, span_s: float = 30.0, max_requests: int = 20_000) -> None:
        self.span_s = span_s
        self.items: deque[Finished] = deque(maxlen=max_requests)

    def add(self, item: Finished) -> None:
        self.items.append(item)

    def recent(self, now: float | None = None) -> list[Finished]:
        """The requests finished within the span (older ones are dropped here)."""
        now = time.monotonic() if now is None else now
        while self.items and self.items[0].at < now - self.span_s:
            self.items.popleft()
        return list(self.items)

    def summary(self, slo: SloTargets, now: float | None = None) -> dict[str, object]:
        """Per tenant, per tier and overall: requests, tokens/s, TTFT and TPOT p50/p95,
        goodput, and each tenant's share of the tokens against its fair share."""
        items = self.recent(now)
        span = self._seconds(items, now)
        tenants = {key: group(rs, span, slo) for key, rs in _by(items, "tenant").items()}
        total = sum(r.tokens for r in items) or 1
        for key, rs in _by(items, "tenant").items():
            tenants[key]["tier"] = rs[-1].tier
            tenants[key]["share"] = round(sum(r.tokens for r in rs) / total, 4)
            tenants[key]["fair_share"] = round(_fair_share(key, items, total), 4)
        return {
            "span_s": round(span, 3),
            "all": group(items, span, slo),
            "tiers": {key: group(rs, span, slo) for key, rs in _by(items, "tier").items()},
            "tenants": tenants,
        }

    def _seconds(self, items: Sequence[Finished], now: float | None) -> float:
        """The window's length so far: the whole span once it has filled."""
        if not items:
            return self.span_s
        now = time.monotonic() if now is None else now
        return max(1.0, min(self.span_s, now - items[0].at))


def group(items: Sequence[Finished], span_s: float, slo: SloTargets) -> dict[str, object]:
    ttfts = [r.ttft for r in items if r.ttft is not None]
    tpots = [r.tpot for r in items if r.tpot is not None]
    good = sum(1 for r in items if slo.met_by(r))
    return {
        "requests": len(items),
        "tokens_per_s": round(sum(r.tokens for r in items) / span_s, 2),
        "ttft_p50": quantile(ttfts, 0.5),
        "ttft_p95": quantile(ttfts, 0.95),
        "tpot_p50": quantile(tpots, 0.5),
        "tpot_p95": quantile(tpots, 0.95),
        "goodput": round(good / len(items), 4) if items else None,
        "goodput_per_s": round(good / span_s, 3),
    }


def quantile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank quantile, rounded to the microsecond; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return round(ordered[rank - 1], 6)


def _by(items: Iterable[Finished], field: str) -> dict[str, list[Finished]]:
    out: dict[str, list[Finished]] = {}
    for r in items:
        out.setdefault(getattr(r, field), []).append(r)
    return out


def _fair_share(tenant: str, items: Sequence[Finished], total: int) -> float:
    """What `tenant` would get of all tokens if its tier's tokens were split by weight among
    the tier's tenants seen in the window (tiers are served by priority, not shared)."""
    mine = [r for r in items if r.tenant == tenant]
    tier = mine[-1].tier
    peers = {r.tenant: r.weight for r in items if r.tier == tier}
    tier_tokens = sum(r.tokens for r in items if r.tier == tier)
    return tier_tokens / total * peers[tenant] / sum(peers.values())
