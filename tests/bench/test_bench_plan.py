from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest

from headrace.bench.plan import (
    WARMUP_CAVEAT,
    Point,
    best_point,
    bisect_rate,
    make_plan,
    meets,
    replicas_needed,
)
from headrace.bench.stats import Slo
from headrace.cli import main


def point(
    level: float,
    tps: float,
    ttft: float | None,
    tpot: float | None = 0.05,
    failed: int = 0,
    requests: int = 100,
) -> Point:
    return Point("rate", level, tps, level, ttft, tpot, requests, failed)


@pytest.mark.parametrize(
    ("peak", "per_replica", "headroom", "expected"),
    [
        (2000, 400, 0.3, 7),  # 6.5 -> 7
        (2000, 500, 0.25, 5),  # exactly 5.0: float noise must not make it 6
        (2000, 500, 0.0, 4),
        (100, 1000, 0.3, 1),  # never fewer than one
        (1000, 3, 0.1, 367),  # 366.67 -> 367
    ],
)
def test_replica_arithmetic(
    peak: float, per_replica: float, headroom: float, expected: int
) -> None:
    assert replicas_needed(peak, per_replica, headroom) == expected


def test_replica_arithmetic_refuses_nonsense() -> None:
    for args in ((2000, 0, 0.3), (0, 100, 0.3), (2000, 100, -0.1)):
        with pytest.raises(ValueError):
            replicas_needed(*args)


def test_a_point_meets_the_slo_only_within_every_limit() -> None:
    slo = Slo(ttft=1.0, tpot=0.1)
    assert meets(point(1, 100, ttft=0.9), slo)
    assert not meets(point(1, 100, ttft=1.1), slo)
    assert not meets(point(1, 100, ttft=0.5, tpot=0.2), slo)
    assert not meets(point(1, 100, ttft=0.5, failed=5), slo)  # shedding load is not speed
    assert meets(point(1, 100, ttft=0.5, failed=1), slo)
    assert not meets(point(1, 0, ttft=None, failed=100), slo)


def test_plan_takes_the_fastest_passing_point() -> None:
    slo = Slo(ttft=1.0)
    points = [point(1, 100, 0.2), point(4, 380, 0.7), point(8, 420, 2.5), point(2, 190, 0.3)]
    assert best_point(points, slo) == points[1]
    plan = make_plan(points, slo, peak_tokens_per_s=2000, headroom=0.3, source="test")
    assert plan is not None
    assert plan.per_replica_tokens_per_s == 380 and plan.at_level == 4
    assert plan.replicas == math.ceil(2000 / 380 * 1.3) == 7
    assert make_plan([point(8, 420, 2.5)], slo, 2000, 0.3, "test") is None


def test_bisection_brackets_a_known_threshold_within_the_probe_budget() -> None:
    capacity = 37.0  # requests/s the imaginary server holds within the SLO
    slo = Slo(ttft=1.0)

    async def measure(rate: float) -> Point:
        return point(rate, rate * 10, ttft=0.5 if rate <= capacity else 3.0)

    probes = asyncio.run(bisect_rate(measure, slo, start_rate=1.0, max_probes=12, tolerance=0.05))
    assert len(probes) <= 12
    best = best_point(probes, slo)
    assert best is not None
    assert capacity / 1.05 <= best.level <= capacity
    lowest_fail = min(p.level for p in probes if not meets(p, slo))
    assert lowest_fail / best.level <= 1.05
    # Budget exhausted before convergence: still bounded, still a passing answer.
    short = asyncio.run(bisect_rate(measure, slo, start_rate=1.0, max_probes=4))
    assert len(short) == 4 and best_point(short, slo) is not None
    # Halves when even the first probe fails.
    low = asyncio.run(bisect_rate(measure, slo, start_rate=200.0, max_probes=8))
    assert [p.level for p in low[:3]] == [200.0, 100.0, 50.0]


def test_plan_from_a_bench_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = []
    for level, tps, ttft in ((1, 60.0, 0.1), (2, 118.0, 0.4), (4, 150.0, 1.8)):
        summary = {
            "output_tokens_per_s": tps,
            "request_throughput": level,
            "ttft_s": {"p95": ttft},
            "tpot_s": {"p95": 0.05},
            "requests": 50,
            "failed": 0,
        }
        runs.append({"mode": "rate", "level": level, "summary": summary})
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"runs": runs}))
    rc = main(["plan", "--from", str(path), "--peak-tokens-per-s", "2000", "--out", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "118.0 output tokens/s" in out and "= 23" in out  # ceil(2000 / 118 * 1.3) = 23
    assert WARMUP_CAVEAT in out
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["replicas"] == 23 and plan["headroom"] == 0.3
    assert [p["meets_slo"] for p in plan["points"]] == [True, True, False]


def test_plan_bisection_finds_the_stub_servers_capacity(stub_server, tmp_path: Path) -> None:
    # 2 slots x 10 tokens x 40 ms: at most 5 requests/s (50 tokens/s); above it the queue, and
    # TTFT with it, grows through each 2 s probe (at 6.5 req/s: ~3 queued, 0.6 s wait at the end).
    url, stub = stub_server(slots=2, token_delay=0.04)
    capacity_rps, capacity_tps = 5.0, 50.0
    rc = main(
        [
            "plan",
            "--url",
            url,
            "--prompt-len",
            "8",
            "--output-len",
            "10",
            "--slo-ttft",
            "0.5",
            "--arrivals",
            "constant",
            "--probe-duration",
            "2",
            "--start-rate",
            "2.5",
            "--max-probes",
            "6",
            "--peak-tokens-per-s",
            "1000",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0
    plan = json.loads((tmp_path / "plan.json").read_text())
    table = [(p["level"], p["ttft_p95"], p["meets_slo"]) for p in plan["points"]]
    assert len(table) <= 6
    assert 0.6 * capacity_rps <= plan["at_level"] <= 1.3 * capacity_rps, table
    assert 0.5 * capacity_tps <= plan["per_replica_tokens_per_s"] <= 1.05 * capacity_tps, table
    assert plan["replicas"] == math.ceil(1000 / plan["per_replica_tokens_per_s"] * 1.3)
    failing = [level for level, _, ok in table if not ok]
    assert failing and min(failing) > plan["at_level"], table
    assert 2 * capacity_rps in failing, table  # twice the capacity is always too much
    bench = json.loads((tmp_path / "bench.json").read_text())
    assert len(bench["runs"]) == len(table)
    assert stub.running == 0 and stub.waiting == 0
