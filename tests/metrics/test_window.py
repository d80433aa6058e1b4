"""The dashboard's request window: eviction by age and by count, per-tenant summaries, goodput
against SLO targets, and a tenant's share of the tokens against its fair share."""

from __future__ import annotations

import pytest

from headrace.metrics.prometheus import Metrics
from headrace.metrics.timing import RequestTimer
from headrace.metrics.window import Finished, RequestWindow, SloTargets, quantile


def done(
    at: float, tenant: str = "a", tier: str = "free", weight: float = 1.0, ttft: float = 0.1,
    tpot: float | None = 0.01, tokens: int = 10, reason: str = "length",
) -> Finished:  # fmt: skip
    return Finished(at, "m", tenant, tier, weight, ttft, tpot, tokens, reason)


def test_old_requests_leave_the_window_and_a_flood_cannot_grow_it() -> None:
    w = RequestWindow(span_s=10, max_requests=3)
    for at in (0.0, 1.0, 2.0, 3.0):
        w.add(done(at))
    assert [r.at for r in w.recent(now=5.0)] == [1.0, 2.0, 3.0]
    assert [r.at for r in w.recent(now=12.5)] == [3.0]
    assert w.recent(now=100.0) == []


def test_goodput_counts_requests_meeting_both_targets() -> None:
    w = RequestWindow(span_s=10)
    w.add(done(1.0, ttft=0.2, tpot=0.01))  # good
    w.add(done(2.0, ttft=2.0, tpot=0.01))  # TTFT too slow
    w.add(done(3.0, ttft=0.2, tpot=0.5))  # tokens too slow
    w.add(done(4.0, ttft=0.2, tpot=0.01, reason="abort"))  # not finished properly
    w.add(done(5.0, ttft=0.3, tpot=None))  # one token: no inter-token latency, good
    s = w.summary(SloTargets(ttft_s=1.0, tpot_s=0.1), now=10.0)
    overall = s["all"]
    assert isinstance(overall, dict)
    assert overall["requests"] == 5
    assert overall["goodput"] == pytest.approx(2 / 5)
    assert overall["goodput_per_s"] == pytest.approx(2 / 9, abs=1e-3)  # the window has run 9 s
    assert overall["ttft_p50"] == 0.2 and overall["ttft_p95"] == 2.0


def test_share_against_fair_share_within_a_tier() -> None:
    w = RequestWindow(span_s=10)
    w.add(done(1.0, "paid1", "paid", tokens=50))
    w.add(done(1.0, "big", "free", weight=3.0, tokens=10))
    w.add(done(1.0, "small", "free", weight=1.0, tokens=40))
    tenants = w.summary(SloTargets(), now=2.0)["tenants"]
    assert isinstance(tenants, dict)
    assert tenants["paid1"]["share"] == 0.5 and tenants["paid1"]["fair_share"] == 0.5
    # The free tier got half the tokens; split 3:1 by weight, big's fair part is 3/8.
    assert tenants["big"]["share"] == 0.1 and tenants["big"]["fair_share"] == 0.375
    assert tenants["small"]["share"] == 0.4 and tenants["small"]["fair_share"] == 0.125
    assert tenants["small"]["tier"] == "free"


def test_quantile_is_nearest_rank() -> None:
    assert quantile([], 0.5) is None
    assert quantile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert quantile([float(i) for i in range(1, 101)], 0.95) == 95.0


def test_metrics_feed_the_window_with_tenant_and_time_per_token() -> None:
    metrics = Metrics()
    timer = RequestTimer(start=100.0)
    timer.on_tokens(1, queue_time=0.05, now=100.4)
    timer.on_tokens(1, now=100.5)
    timer.on_tokens(1, now=100.7)
    timer.finish(now=100.7)
    metrics.observe_request("m", "paid", timer, "stop", 5, 3, tenant="acme", weight=2.0)
    [r] = metrics.window.recent(now=101.0)
    assert (r.tenant, r.tier, r.weight) == ("acme", "paid", 2.0)
    assert (r.tokens, r.finish_reason) == (8, "stop")
    assert r.ttft == pytest.approx(0.4) and r.tpot == pytest.approx(0.15)
    assert r.at == 100.7
