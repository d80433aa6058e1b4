"""`headrace plan --demand-trace`: a replica schedule, hour by hour, from a recorded trace
(CSV or JSON, Unix or ISO timestamps) through the autoscaler's forecast."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from headrace.bench import BenchError
from headrace.bench.schedule import load_trace, resample, schedule
from headrace.cli import main

T0 = 1_700_000_000 // 86_400 * 86_400  # a midnight, UTC


def working_day(t: float) -> float:
    """100 tokens/s at night, 1000 from 09:00 to 18:00."""
    hour = t % 86_400 / 3600
    return 1000.0 if 9 <= hour < 18 else 100.0


def write_csv(path: Path, days: int, step: int = 300) -> None:
    rows = ["timestamp,tokens_per_s"]
    rows += [f"{T0 + i},{working_day(i)}" for i in range(0, days * 86_400, step)]
    path.write_text("\n".join(rows) + "\n")


def test_two_days_of_history_give_a_daily_schedule(tmp_path: Path) -> None:
    path = tmp_path / "demand.csv"
    write_csv(path, days=2)
    slots, seasonal = schedule(load_trace(str(path)), per_replica=200, headroom=0.0, hours=24)
    assert seasonal and len(slots) == 24
    assert slots[0].start == T0 + 2 * 86_400  # the next day's midnight
    by_hour = [s.replicas for s in slots]
    assert max(by_hour[10:17]) >= 5 and all(n >= 4 for n in by_hour[10:17])  # ~1000 / 200
    assert max(by_hour[0:7]) <= 2  # nights need one or two


def test_iso_timestamps_in_json_and_resampling(tmp_path: Path) -> None:
    path = tmp_path / "demand.json"
    samples = [{"timestamp": f"2026-12-01T10:{m:02d}:00Z", "tokens_per_s": 300 + m}
               for m in range(0, 60, 2)]  # fmt: skip
    path.write_text(json.dumps(samples))
    points = load_trace(str(path))
    rates, step, _ = resample(points)
    assert step == 120 and len(rates) == 30 and rates[0] == 300
    slots, seasonal = schedule(points, per_replica=100, headroom=0.3, hours=3)
    assert not seasonal and len(slots) == 3
    assert slots[0].replicas == math.ceil(slots[0].peak_tokens_per_s / 100 * 1.3 - 1e-9)


def test_a_bad_trace_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("time,rate\n1,2\n")
    with pytest.raises(BenchError, match="not a demand trace"):
        load_trace(str(path))


def test_plan_prints_and_writes_the_schedule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = tmp_path / "bench.json"
    summary = {"output_tokens_per_s": 200.0, "request_throughput": 2, "ttft_s": {"p95": 0.2},
               "tpot_s": {"p95": 0.05}, "requests": 50, "failed": 0}  # fmt: skip
    bench.write_text(json.dumps({"runs": [{"mode": "rate", "level": 2, "summary": summary}]}))
    trace = tmp_path / "demand.csv"
    write_csv(trace, days=2)
    rc = main(["plan", "--from", str(bench), "--demand-trace", str(trace), "--headroom", "0",
               "--schedule-hours", "24", "--start-s", "120", "--out", str(tmp_path)])  # fmt: skip
    assert rc == 0
    out = capsys.readouterr().out
    assert "replica schedule" in out and "120 s before" in out
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert len(plan["schedule"]) == 24 and plan["schedule"][12]["replicas"] >= 5
