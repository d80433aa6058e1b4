"""Tenant limits shared by two front ends through one `LimitsPool` (what the Ray actor runs),
with leases settled by explicit syncs on a fake clock (no Ray): the limit holds across both,
each gets a share, an idle front end gives its lease back, a vanished one its slots."""

from __future__ import annotations

import itertools

import pytest

from headrace.gateway import limits_actor
from headrace.gateway.errors import GatewayError
from headrace.gateway.lease import IDLE_S, Lease
from headrace.gateway.limits_actor import LimitsPool
from headrace.gateway.ratelimit import TenantLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FrontEnd:
    """One front end's limiter for tenant `acme`, leased from the shared pool."""

    def __init__(
        self, name: str, pool: LimitsPool, clock: Clock, tpm: int | None, conc: int | None
    ):
        self.name = name
        self.pool = pool
        self.limiter = TenantLimiter("acme", tpm, conc, clock)
        self.lease = Lease(self.limiter)
        self.lease.install()
        self.tickets = itertools.count(1)

    def sync(self) -> None:
        (grant,) = self.pool.sync(self.name, [self.lease.outgoing()])
        self.lease.apply(grant)

    def admit(self, tokens: int) -> int | None:
        ticket = next(self.tickets)
        try:
            self.limiter.reserve(ticket, tokens)
        except GatewayError as e:
            assert e.status == 429
            return None
        return ticket


def pair(tpm: int | None = None, conc: int | None = None) -> tuple[FrontEnd, FrontEnd, Clock]:
    clock = Clock()
    pool = LimitsPool(clock)
    return FrontEnd("a", pool, clock, tpm, conc), FrontEnd("b", pool, clock, tpm, conc), clock


def test_the_token_limit_holds_across_two_front_ends() -> None:
    a, b, _ = pair(tpm=600)
    admitted = {"a": 0, "b": 0}
    for _ in range(20):  # no time passes: no refill
        for fe in (a, b):
            if fe.admit(50) is not None:
                admitted[fe.name] += 50
            a.sync()
            b.sync()
    assert sum(admitted.values()) == 600  # not 2 x 600, as two separate limiters would allow
    assert admitted["a"] >= 200 and admitted["b"] >= 200, admitted


def test_credit_is_charged_at_the_next_sync() -> None:
    a, b, _ = pair(tpm=600)
    a.sync()
    b.sync()  # neither has seen the tenant: nothing leased, 600 free in the pool
    assert a.admit(400) is not None  # on credit, against what was free at the last sync
    a.sync()  # charged: 200 left, all of it leased to a (the only front end using it)
    b.sync()
    assert b.admit(300) is None  # b's 600 free at its last sync is 0 now
    assert a.admit(201) is None and a.admit(200) is not None


def test_concurrency_holds_across_front_ends_and_slots_come_back() -> None:
    a, b, _ = pair(conc=3)
    tickets = []
    for _ in range(4):
        for fe in (a, b):
            ticket = fe.admit(1)
            if ticket is not None:
                tickets.append((fe, ticket))
            a.sync()
            b.sync()
    assert len(tickets) == 3
    fe, ticket = tickets[0]
    fe.limiter.settle(ticket, 1, 1)
    for _ in range(2):
        a.sync()
        b.sync()
    assert a.admit(1) is not None or b.admit(1) is not None


def test_an_idle_front_end_gives_its_lease_back() -> None:
    a, b, clock = pair(tpm=600)
    b.admit(1)  # b saw the tenant: it holds a share
    a.sync()
    b.sync()
    assert b.lease.tokens > 0
    clock.now += IDLE_S + 1
    a.admit(1)
    for _ in range(3):
        a.sync()
        b.sync()
    assert b.lease.tokens == 0 and a.admit(590) is not None  # the whole limit is a's now


def test_a_front_end_that_vanished_frees_its_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    a, b, clock = pair(conc=2)
    b.admit(1)
    b.sync()
    b.admit(1)  # b holds both slots
    b.sync()
    a.sync()
    assert a.admit(1) is None
    clock.now += limits_actor.CLIENT_TIMEOUT_S + 1  # b is gone without a word
    a.sync()
    a.sync()
    assert a.admit(1) is not None
