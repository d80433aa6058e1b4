"""The autoscaling policy on demand traces with a fake clock: it scales up ahead of rising
demand by the replica start time, keeps replicas through a spike or a dip shorter than the
cool-down, holds its bounds, learns the capacity while requests queue; and the loop does not
retry a failing start in a loop."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

import pytest
from fake_engine import FakeEngine

from headrace.config import AutoscaleConfig
from headrace.router.autoscale_loop import AutoscaleLoop
from headrace.router.autoscaler import Autoscaler, Sample
from headrace.router.replica import Replica
from headrace.router.router import Router

STEP_S = 60.0
TPS = 100.0  # tokens/s one replica sustains


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make(bounds: str = "1:20", **overrides: float) -> tuple[Autoscaler, Clock]:
    fields: dict[str, object] = {
        "autoscale": bounds, "autoscale_replica_tokens_per_s": TPS, "autoscale_headroom": 0.0,
        "autoscale_horizon_s": 60.0, "autoscale_cooldown_s": 900.0, "autoscale_start_s": 300.0,
        "autoscale_interval_s": STEP_S, **overrides,
    }  # fmt: skip
    clock = Clock()
    return Autoscaler(AutoscaleConfig(**fields), clock), clock  # type: ignore[arg-type]


def drive(
    policy: Autoscaler, clock: Clock, demand: Callable[[float], float], seconds: float
) -> list[tuple[float, float, int]]:
    """(time, demand, replicas) each step; replicas change at once (the start time is the
    policy's lead, checked against the demand)."""
    replicas, trace = policy.min_replicas, []
    for _ in range(int(seconds / STEP_S)):
        clock.now += STEP_S
        d = demand(clock.now)
        policy.observe(Sample(d, replicas, queued=False))
        replicas = policy.target(replicas)
        trace.append((clock.now, d, replicas))
    return trace


def first(trace: list[tuple[float, float, int]], check: Callable[[float, int], bool]) -> float:
    return next(t for t, d, n in trace if check(d, n))


def test_rising_demand_is_met_ahead_by_the_start_time() -> None:
    policy, clock = make()
    ramp = lambda t: 100 + 850 * min(t / 10_800, 1.0)  # noqa: E731  100 -> 950 tokens/s in 3 h
    trace = drive(policy, clock, ramp, 4 * 3600)
    start_s = policy.start_time_s
    for k in range(4, 10):  # once the trend is learned (it starts at 0)
        needed_at = first(trace, lambda d, n, k=k: d > (k - 1) * TPS)  # type: ignore[misc]
        asked_at = first(trace, lambda d, n, k=k: n >= k)  # type: ignore[misc]
        assert asked_at <= needed_at - start_s, (k, asked_at, needed_at)
    assert trace[-1][2] == 10  # and no more than the plateau needs


def test_a_spike_or_dip_shorter_than_the_cooldown_does_not_scale_down() -> None:
    policy, clock = make()
    dip = lambda t: 100.0 if 3600 <= t < 3600 + 600 else 500.0  # noqa: E731  a 10-min dip
    trace = drive(policy, clock, dip, 2 * 3600)
    at_5 = first(trace, lambda d, n: n >= 5)
    assert all(n >= 5 for t, _, n in trace if t >= at_5)

    policy, clock = make()
    spike = lambda t: 900.0 if 3600 <= t < 3600 + 300 else 200.0  # noqa: E731  5 minutes
    trace = drive(policy, clock, spike, 3 * 3600)
    top = max(n for _, _, n in trace)
    assert top >= 5
    down = [t for (t, _, n), (_, _, prev) in zip(trace[1:], trace[:-1], strict=True) if n < prev]
    assert down and min(down) >= 3600 + 300 + 900  # only a cool-down after the spike ended
    assert trace[-1][2] == 2


def test_bounds_hold() -> None:
    policy, clock = make("2:4")
    trace = drive(policy, clock, lambda t: 5000.0, 1800)
    assert {n for _, _, n in trace} <= {2, 3, 4} and trace[-1][2] == 4
    policy.observe(Sample(5000.0, 4, queued=True))  # queueing asks for one more: not past MAX
    assert policy.target(4) == 4
    trace = drive(policy, clock, lambda t: 0.0, 4 * 3600)
    assert trace[-1][2] == 2


def test_the_capacity_is_learned_while_requests_queue() -> None:
    policy, clock = make(autoscale_replica_tokens_per_s=None)  # type: ignore[arg-type]
    policy.observe(Sample(150.0, 1, queued=False))
    assert policy.target(1) == 1  # capacity unknown and nothing queues: stay
    clock.now += STEP_S
    policy.observe(Sample(120.0, 1, queued=True))  # one replica at capacity: 120 tokens/s
    assert policy.replica_tokens_per_s == 120.0
    assert policy.target(1) >= 2


def test_the_start_time_is_measured() -> None:
    policy, _ = make()
    policy.started(100.0)
    assert policy.start_time_s == pytest.approx(200.0)  # half way from the assumed 300 s


class FailingSet:
    """A replica set whose starts always fail."""

    def __init__(self) -> None:
        self.size = 1
        self.attempts = 0

    async def add(self) -> None:
        self.attempts += 1
        raise RuntimeError("out of memory")

    async def remove(self) -> None:
        self.size -= 1


def test_a_failing_start_backs_off_instead_of_looping() -> None:
    policy, clock = make(autoscale_interval_s=1.0)
    router = Router("m", [Replica("m/0", FakeEngine())])
    replicas = FailingSet()
    loop = AutoscaleLoop(router, replicas, policy, clock)

    async def run() -> None:
        for _ in range(600):  # ten minutes of 1 s ticks with demand for 5 replicas
            clock.now += 1.0
            router.tokens_delivered += 500
            loop.tick()
            await loop.settle()

    asyncio.run(run())
    # each round tries the 4 missing replicas at once, then backs off 2, 4, 8, ... s: a
    # handful of rounds in ten minutes, not one per tick
    rounds = replicas.attempts / 4
    assert 3 <= rounds <= math.ceil(math.log2(600)) + 1, replicas.attempts
    assert policy.failures == rounds and replicas.size == 1
