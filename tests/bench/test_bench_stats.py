from __future__ import annotations

import numpy as np
import pytest

from headrace.bench.stats import (
    RequestResult,
    Slo,
    distribution,
    error_counts,
    goodput,
    percentile,
    summarize,
    summarize_groups,
)


def ok(i: int, ttft: float, e2e: float, tokens: int, **kw: object) -> RequestResult:
    return RequestResult(
        index=i, start=0.0, ok=True, status=200, ttft=ttft, e2e=e2e, output_tokens=tokens, **kw
    )  # type: ignore[arg-type]


def failed(i: int, status: int | None, error: str) -> RequestResult:
    return RequestResult(index=i, start=0.0, ok=False, status=status, error=error)


def test_percentiles_of_one_to_ten_by_hand() -> None:
    values = [float(v) for v in range(10, 0, -1)]  # unsorted on purpose
    assert percentile(values, 0) == 1.0
    assert percentile(values, 50) == pytest.approx(5.5)
    assert percentile(values, 95) == pytest.approx(9.55)
    assert percentile(values, 99) == pytest.approx(9.91)
    assert percentile(values, 100) == 10.0


def test_percentiles_match_numpy_on_skewed_samples() -> None:
    rng = np.random.default_rng(7)
    values = list(rng.lognormal(mean=-1.0, sigma=1.2, size=257))
    for q in (1, 50, 90, 95, 99, 99.9):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_percentile_edge_cases() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    with pytest.raises(ValueError):
        percentile([1.0], 101)
    dist = distribution([])
    assert dist["count"] == 0 and dist["p95"] is None and dist["mean"] is None


def test_tpot_excludes_the_first_token() -> None:
    assert ok(0, ttft=0.5, e2e=1.5, tokens=11).tpot == pytest.approx(0.1)
    assert ok(0, ttft=0.5, e2e=0.5, tokens=1).tpot is None
    assert failed(0, 500, "x").tpot is None


def test_goodput_counts_requests_meeting_every_slo() -> None:
    results = [
        ok(0, ttft=0.2, e2e=1.2, tokens=11),  # TPOT 0.1: meets both
        ok(1, ttft=0.9, e2e=1.9, tokens=11),  # TTFT too slow
        ok(2, ttft=0.2, e2e=3.2, tokens=11),  # TPOT 0.3: too slow
        ok(3, ttft=0.4, e2e=0.4, tokens=1),  # one token: no TPOT, meets TTFT
        failed(4, 503, "overloaded_error"),
    ]
    g = goodput(results, Slo(ttft=0.5, tpot=0.15), duration_s=2.0)
    assert g["requests"] == 2
    assert g["share"] == pytest.approx(2 / 5)
    assert g["rate_per_s"] == pytest.approx(1.0)
    assert goodput(results, Slo(), 2.0)["requests"] == 4  # no SLO: every success counts


def test_errors_grouped_by_status_and_type() -> None:
    results = [
        failed(0, 429, "rate_limit_error"),
        failed(1, 429, "rate_limit_error"),
        failed(2, None, "connect_error"),
        failed(3, 200, "overloaded_error"),
        ok(4, 0.1, 0.2, 2),
    ]
    assert error_counts(results) == {
        "by_status": {"200": 1, "429": 2, "no_response": 1},
        "by_type": {"connect_error": 1, "overloaded_error": 1, "rate_limit_error": 2},
    }


def test_summary_rates_and_groups() -> None:
    results = [
        ok(0, 0.1, 1.1, 11, prompt_tokens=5, tenant="a", tier="paid", itl=[0.1, 0.1]),
        ok(1, 0.3, 2.3, 21, prompt_tokens=5, tenant="b", tier="free", itl=[0.2]),
        failed(2, 429, "rate_limit_error"),
    ]
    results[2].tenant, results[2].tier = "b", "free"
    s = summarize(results, duration_s=4.0, slo=Slo(ttft=0.2))
    assert (s["requests"], s["completed"], s["failed"]) == (3, 2, 1)
    assert s["output_tokens"] == 32 and s["output_tokens_per_s"] == pytest.approx(8.0)
    assert s["total_tokens_per_s"] == pytest.approx(42 / 4)
    assert s["request_throughput"] == pytest.approx(0.5)
    assert s["ttft_s"]["p50"] == pytest.approx(0.2)
    assert s["itl_s"]["count"] == 3
    groups = summarize_groups(results, 4.0, Slo(), "tier")
    assert set(groups) == {"free", "paid"}
    assert groups["free"]["failed"] == 1 and groups["paid"]["output_tokens"] == 11
