"""Tenant-fair shedding: a tenant is judged by its own share of the queue (unit tests)."""

from __future__ import annotations

import re

import pytest

from gateway.shedding import (
    BATCH,
    FOURTH,
    HOG,
    LIGHT,
    PAID,
    THIRD,
    Stats,
    flood,
    next_ticket,
    refused,
    with_deadline,
)
from headrace.engine.messages import StepStats
from headrace.gateway.base import Tenant
from headrace.gateway.overload import LoadShedder


def test_a_flood_does_not_shut_out_a_tenant_under_its_share() -> None:
    s = LoadShedder(max_queued_requests=8)
    assert flood(s, HOG, 40) == 8  # alone, the hog may fill the whole bound
    # The queue is full, but light has nothing queued: its share is 8 * 1/2 = 4.
    assert flood(s, LIGHT, 5) == 4
    err = refused(s.check, LIGHT, "m")
    assert "this tenant has 4 requests queued" in err.message
    assert re.findall(r"\d+", err.message) == ["4"]  # its own figure, not the hog's or the bound
    refused(s.check, HOG, "m")
    assert flood(s, HOG, 10) == 0
    assert s.queued_ahead("m", 1) == (12, 1200)  # over the bound by light's share, no more


def test_overshoot_is_bounded_by_the_late_tenants_shares() -> None:
    together = LoadShedder(max_queued_requests=8)
    for _ in range(10):  # floods that start together share the bound: no overshoot at all
        for t in (HOG, LIGHT, THIRD, FOURTH):
            flood(together, t, 1)
    assert together.queued_ahead("m", 1)[0] == 8
    one_by_one = LoadShedder(max_queued_requests=8)
    hogs_first = next_ticket() + 1
    admitted = [flood(one_by_one, t, 40) for t in (HOG, LIGHT, THIRD, FOURTH)]
    assert admitted == [8, 4, 3, 2]  # each at most its share, ceil(8 / k), when it came
    assert all(flood(one_by_one, t, 5) == 0 for t in (HOG, LIGHT, THIRD, FOURTH))
    assert one_by_one.dequeue(hogs_first)  # the hog's oldest starts: still over its share
    assert flood(one_by_one, HOG, 1) == 0 and flood(one_by_one, FOURTH, 1) == 0
    for ticket in range(hogs_first + 1, hogs_first + 8):  # the hog's queue empties
        assert one_by_one.dequeue(ticket)
    assert flood(one_by_one, HOG, 5) == 2  # its share again, nothing banked


def test_weights_set_the_shares() -> None:
    s = LoadShedder(max_queued_requests=8)
    heavy = Tenant("heavy", "free", 1, weight=3.0)
    assert flood(s, HOG, 40) == 8
    assert flood(s, heavy, 40) == 6  # 8 * 3 / (1 + 3)
    # A third tenant of weight 1: 8 * 1 / 5 = 1.6, rounded up.
    assert flood(s, THIRD, 40) == 2


def test_priority_order_is_kept() -> None:
    s = LoadShedder(max_queued_requests=8)
    other_paid = Tenant("p2", "paid", 0)
    assert flood(s, PAID, 40) == 8
    err = refused(s.check, LIGHT, "m")  # more urgent work fills the bound: no share for free
    assert "full with requests of more urgent tiers" in err.message
    assert not re.search(r"\d", err.message)  # nothing of the paid tenant's queue
    assert flood(s, other_paid, 40) == 4  # another paid tenant gets its share
    s2 = LoadShedder(max_queued_requests=8)
    assert flood(s2, HOG, 40) == 8
    assert flood(s2, PAID, 40) == 8  # free requests never count ahead of paid ones
    s3 = LoadShedder(max_queued_requests=8)
    assert flood(s3, PAID, 4) == 4
    assert flood(s3, HOG, 40) == 4  # the bound less the paid requests ahead
    assert flood(s3, LIGHT, 40) == 2  # and light's share of what paid leaves: 4 / 2
    assert flood(s3, BATCH, 40) == 0  # batch waits behind everyone


def test_token_bound_is_shared_too() -> None:
    s = LoadShedder(max_queued_tokens=1000)
    assert flood(s, HOG, 40) == 10
    assert flood(s, LIGHT, 40) == 5  # 100-token requests up to its share of 500
    err = refused(s.admit, LIGHT, "m", 100)
    assert "this tenant has 500 tokens queued; this request's 100 more" in err.message
    assert re.findall(r"\d+", err.message) == ["500", "100"]  # none of the hog's 1000
    assert flood(s, HOG, 1) == 0
    # A tenant with nothing queued gets one request in, even one larger than its share.
    assert flood(s, THIRD, 1, tokens=800) == 1
    assert flood(s, THIRD, 1) == 0


def test_expected_wait_is_the_fair_queues() -> None:
    stats = Stats()
    s = LoadShedder()
    s.stats_source = stats
    stats.step("m", tokens=100, seconds=0.1, waiting=5)  # 1000 tokens/s
    hog5, light5 = with_deadline(HOG, 5.0), with_deadline(LIGHT, 5.0)
    for _ in range(20):
        s.enqueue(next_ticket(), HOG, "m", 500)
    # The hog waits for its own 10000 tokens and an average request: 10.5 s.
    assert s.expected_wait(HOG, "m") == pytest.approx(10.5)
    assert "expected wait 10.5 s" in refused(s.admit, hog5, "m", 500).message
    # Light waits for as much of the hog's work as its own (100), and a running one to end.
    assert s.expected_wait(LIGHT, "m", 100) == pytest.approx((100 + 500) / 1000)
    s.admit(light5, "m", 100)
    for _ in range(2):
        s.enqueue(next_ticket(), LIGHT, "m", 100)
    slot = 10200 / 22
    assert s.expected_wait(LIGHT, "m", 100) == pytest.approx((200 + 300 + slot) / 1000)
    heavy = Tenant("light", "free", 1, weight=2.0)  # twice the weight: half the hog's part
    assert s.expected_wait(heavy, "m", 100) == pytest.approx((200 + 150 + slot) / 1000)
    for _ in range(10):  # lower priorities never count
        s.enqueue(next_ticket(), BATCH, "m", 5000)
    assert s.expected_wait(LIGHT, "m", 100) == pytest.approx((200 + 300 + slot) / 1000)
    s.enqueue(next_ticket(), PAID, "m", 3000)  # more urgent work counts in full
    slot = 13200 / 23
    assert s.expected_wait(LIGHT, "m", 100) == pytest.approx((3000 + 200 + 300 + slot) / 1000)
    assert s.expected_wait(PAID, "m") == pytest.approx((3000 + 3000) / 1000)


def test_hanging_up_early_does_not_shrink_anyones_estimate() -> None:
    stats = Stats()
    s = LoadShedder()
    s.stats_source = stats
    stats.step("m", tokens=100, seconds=0.1, waiting=5)  # 1000 tokens/s
    for _ in range(4):
        s.enqueue(next_ticket(), HOG, "m", 600)
    before = s.expected_wait(LIGHT, "m", 100)
    assert before == pytest.approx((100 + 600) / 1000)
    for reason in ("abort", "error", "timeout", "overloaded", None) * 20:
        s.observe_finish("hog", 600, 11, reason)  # one token, then gone
    assert s.expected_wait(LIGHT, "m", 100) == before
    assert s.expected_wait(HOG, "m") == pytest.approx((2400 + 600) / 1000)
    assert s.output_ratio == 1.0 and s.ratios.of("hog") == 1.0
    for _ in range(50):  # finished normally, using a quarter of what they reserved
        s.observe_finish("hog", 600, 150, "stop")
    assert s.ratios.of("hog") == pytest.approx(0.25, abs=0.01)
    assert s.output_ratio == pytest.approx(0.25, abs=0.01)  # light has no history: the mean
    assert s.expected_wait(LIGHT, "m", 100) == pytest.approx((25 + 150) / 1000, rel=0.05)
    for _ in range(50):  # light's own history is its own
        s.observe_finish("light", 200, 200, "length")
    assert s.ratios.of("light") == pytest.approx(1.0)
    assert s.ratios.of("hog") == pytest.approx(0.25, abs=0.01)
    assert s.expected_wait(LIGHT, "m", 100) == pytest.approx((100 + 150) / 1000, rel=0.05)


def test_per_tenant_backlogs_are_reconciled_with_the_engines_report(clock) -> None:  # type: ignore[no-untyped-def]
    stats = Stats()
    s = LoadShedder(clock=clock)
    s.stats_source = stats
    for _ in range(4):
        s.enqueue(next_ticket(), HOG, "m", 500)

    def report(waiting: tuple[tuple[int, int, int], ...]) -> None:
        clock.advance(0.01)
        stats.latest["m"] = StepStats(step_duration=0.1, num_batched_tokens=100,
                                      num_waiting=sum(w[1] for w in waiting) or 1,
                                      waiting_by_priority=waiting)  # fmt: skip
        s.queued_ahead("m", 9)

    report(((1, 4, 2000),))
    report(((1, 2, 1000),))  # two of the hog's started; their first outputs are on the way
    # The hog's backlog is scaled to what really waits: 1000 tokens and one request of 500.
    assert s.expected_wait(HOG, "m") == pytest.approx((1000 + 500) / 1000)
    assert s.expected_wait(LIGHT, "m", 100) == pytest.approx((100 + 500) / 1000)
    # Five wait, 2600 tokens: more than the backlogs (preempted requests had started). The
    # rest counts as one more tenant of light's weight.
    report(((1, 5, 2600),))
    assert s.expected_wait(LIGHT, "m", 100) == pytest.approx((100 + 100 + 520) / 1000)
    assert s.expected_wait(HOG, "m") == pytest.approx((2000 + 600 + 520) / 1000)
