"""Helpers for the load-shedding unit tests: a fake stats source, tenants, floods."""

from __future__ import annotations

import itertools

import pytest

from headrace.engine.messages import StepStats
from headrace.gateway.base import Tenant
from headrace.gateway.errors import GatewayError
from headrace.gateway.overload import LoadShedder


class Stats:
    """A stats source: the engine's latest step per model, set by the test."""

    def __init__(self) -> None:
        self.latest: dict[str, StepStats] = {}

    def __call__(self) -> dict[str, StepStats]:
        return dict(self.latest)

    def step(
        self, model: str, tokens: int, seconds: float, waiting: int = 1, total: int = 0
    ) -> None:
        self.latest[model] = StepStats(
            step_duration=seconds,
            num_batched_tokens=tokens,
            num_waiting=waiting,
            num_tokens_total=total,
        )


FREE = Tenant("a", "free", 1)
PAID = Tenant("p", "paid", 0)
BATCH = Tenant("c", "batch", 2)


def with_deadline(tenant: Tenant, seconds: float | None) -> Tenant:
    return Tenant(tenant.name, tenant.tier, tenant.priority, tenant.weight, seconds)


def refused(fn, *args) -> GatewayError:  # type: ignore[no-untyped-def]
    with pytest.raises(GatewayError) as e:
        fn(*args)
    return e.value


HOG, LIGHT, THIRD, FOURTH = (Tenant(n, "free", 1) for n in ("hog", "light", "third", "fourth"))


def flood(s: LoadShedder, tenant: Tenant, n: int, tokens: int = 100) -> int:
    """`n` requests of `tenant` arrive; returns how many were admitted (and stay queued)."""
    admitted = 0
    for _ in range(n):
        try:
            s.admit(tenant, "m", tokens)
        except GatewayError as e:
            assert (e.status, e.error_type) == (503, "overloaded_error")
            assert int(e.headers["retry-after"]) >= 1
            continue
        s.enqueue(next_ticket(), tenant, "m", tokens)
        admitted += 1
    return admitted


_tickets = itertools.count()


def next_ticket() -> int:
    return next(_tickets)
