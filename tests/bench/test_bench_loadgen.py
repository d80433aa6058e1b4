"""The load generator's bounds and arrival processes, against the stub server."""

from __future__ import annotations

import asyncio
import time

import pytest

from headrace.bench.client import Target
from headrace.bench.loadgen import Bounds, run_level
from headrace.bench.workloads import Workload

FAST = Workload(prompt_len=(4, 4), output_len=(2, 2))
SLOW = Workload(prompt_len=(4, 4), output_len=(50, 50))  # 50 x 40 ms: 2 s per request


def test_constant_arrivals_are_evenly_spaced(stub_server) -> None:
    url, _ = stub_server(slots=8, token_delay=0.001)
    run = asyncio.run(
        run_level(
            Target(url),
            FAST,
            "rate",
            20.0,
            Bounds(num_requests=10),
            arrivals="constant",
            scrape_interval=None,
        )
    )
    starts = [r.start for r in run.results]
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    assert len(run.results) == 10 and all(r.ok for r in run.results)
    assert sum(gaps) / len(gaps) == pytest.approx(0.05, abs=0.01)


def test_poisson_arrivals_follow_the_rate(stub_server) -> None:
    url, _ = stub_server(slots=16, token_delay=0.001)
    run = asyncio.run(
        run_level(Target(url), FAST, "rate", 100.0, Bounds(num_requests=60), scrape_interval=None)
    )
    starts = sorted(r.start for r in run.results)
    mean_gap = (starts[-1] - starts[0]) / (len(starts) - 1)
    assert 0.005 < mean_gap < 0.02  # 1/rate = 0.01 s; 60 exponential gaps: within a factor 2
    gaps = sorted(b - a for a, b in zip(starts, starts[1:], strict=False))
    assert gaps[len(gaps) // 2] < mean_gap  # exponential: the median gap is below the mean


def test_duration_bounds_sending_and_drain_cancels_the_rest(stub_server) -> None:
    url, stub = stub_server(slots=64, token_delay=0.04)
    t0 = time.perf_counter()
    bounds = Bounds(num_requests=1000, duration=0.5, drain_timeout=0.3)
    run = asyncio.run(
        run_level(
            Target(url), SLOW, "rate", 20.0, bounds, arrivals="constant", scrape_interval=None
        )
    )
    elapsed = time.perf_counter() - t0
    assert len(run.results) == 11  # arrivals at 0, 0.05, ..., 0.5 s
    assert all(r.error == "cancelled" and r.max_tokens == 50 for r in run.results)
    assert elapsed < 2.0 and run.duration_s == pytest.approx(0.8, abs=0.3)
    closed = asyncio.run(
        run_level(
            Target(url),
            SLOW,
            "concurrency",
            3,
            Bounds(num_requests=None, duration=0.2, drain_timeout=0.2),
            scrape_interval=None,
        )
    )
    assert [r.error for r in closed.results] == ["cancelled"] * 3
    deadline = time.monotonic() + 5
    while stub.running and time.monotonic() < deadline:  # the stub saw the clients go
        time.sleep(0.05)
    assert stub.running == 0
