from __future__ import annotations

import pytest

from gateway.shedding import BATCH, FREE, PAID, Stats, refused, with_deadline
from headrace.engine.messages import StepStats
from headrace.gateway.overload import LoadShedder


def test_request_bound_counts_only_requests_ahead() -> None:
    s = LoadShedder(max_queued_requests=3)
    for ticket in range(3):
        s.enqueue(ticket, FREE, "m", 100)
    err = refused(s.check, FREE, "m")
    assert (err.status, err.error_type, err.reason) == (503, "overloaded_error", "overloaded")
    assert err.headers["retry-after"] == "1"  # nothing measured yet
    s.check(PAID, "m")  # a paid request has nobody ahead of it
    s.check(FREE, "other")  # another model has its own queue
    s.enqueue(10, BATCH, "m", 100)  # batch requests wait behind free ones, not ahead
    refused(s.check, BATCH, "m")
    assert s.dequeue(0) and not s.dequeue(0)
    s.check(FREE, "m")


def test_token_bound() -> None:
    s = LoadShedder(max_queued_tokens=1000)
    s.enqueue(1, FREE, "m", 700)
    s.admit(FREE, "m", 300)
    err = refused(s.admit, FREE, "m", 301)
    assert "this tenant has 700 tokens queued; this request's 301 more" in err.message


def test_expected_wait_uses_throughput_measured_at_capacity(clock) -> None:  # type: ignore[no-untyped-def]
    stats = Stats()
    s = LoadShedder(clock=clock)
    s.stats_source = stats
    s.enqueue(1, FREE, "m", 2000)
    assert s.expected_wait(FREE, "m") is None  # no throughput known: no guess
    stats.step("m", tokens=50, seconds=0.5, waiting=0, total=1000)  # not at capacity
    assert s.expected_wait(FREE, "m") is None
    stats.step("m", tokens=200, seconds=0.5, waiting=3, total=1200)  # 400 tokens/s a step
    # 2000 tokens ahead, plus one request's worth for a slot to free: 4000 at 400 tokens/s.
    assert s.expected_wait(FREE, "m") == pytest.approx(10.0)
    assert s.expected_wait(PAID, "m") == 0.0  # nothing ahead of a paid request
    clock.advance(1.0)
    # Over wall time only 250 tokens/s: steps are not all the time there is. That wins.
    stats.step("m", tokens=200, seconds=0.5, waiting=3, total=1450)
    assert s.expected_wait(FREE, "m") == pytest.approx(16.0)
    clock.advance(0.1)
    stats.step("m", tokens=10, seconds=0.5, waiting=0, total=1460)  # queue gone: rates stay
    assert s.expected_wait(FREE, "m") == pytest.approx(16.0)
    # Finished requests used a quarter of what they reserved: expect that of the queue too.
    for _ in range(50):
        s.observe_finish("a", 400, 100, "length")
    assert s.ratios.of("a") == pytest.approx(0.25, abs=0.01)
    assert s.expected_wait(FREE, "m") == pytest.approx(4.0, abs=0.1)


def test_refused_at_arrival_when_the_wait_exceeds_the_deadline() -> None:
    stats = Stats()
    s = LoadShedder()
    s.stats_source = stats
    stats.step("m", tokens=100, seconds=0.1, waiting=5)  # 1000 tokens/s
    free5 = with_deadline(FREE, 5.0)
    s.enqueue(1, FREE, "m", 2000)
    s.admit(free5, "m", 10)  # (2000 + 2000) / 1000 = 4 s, deadline 5 s
    s.enqueue(2, FREE, "m", 3000)
    err = refused(s.admit, free5, "m", 10)  # (5000 + 2500) / 1000 = 7.5 s
    assert err.status == 503 and "exceeds this tier's queue deadline of 5 s" in err.message
    assert err.headers["retry-after-ms"] == "2500"
    assert err.headers["retry-after"] == "3"
    s.admit(FREE, "m", 10)  # no deadline: no estimate refusal
    s.admit(with_deadline(BATCH, 60.0), "m", 10)  # batch: long deadline
    s.admit(with_deadline(PAID, 5.0), "m", 10)  # paid: nothing ahead
    # Unknown model names fall back to the sum over the engines.
    s.enqueue(3, FREE, "", 6000)
    refused(s.admit, free5, "", 10)


def test_engine_reports_replace_the_gateways_guess(clock) -> None:  # type: ignore[no-untyped-def]
    """Once the engine reports its queue per priority, requests it has seen count as it says
    (a started request whose first token is slow is not 'queued'); requests admitted after the
    engine's last-but-one report are added as in transit."""
    stats = Stats()
    s = LoadShedder(clock=clock)
    s.stats_source = stats
    s.enqueue(1, FREE, "m", 100)  # no report yet: the gateway's own view
    assert s.queued_ahead("m", 1) == (1, 100)

    def report(waiting: tuple[tuple[int, int, int], ...]) -> None:
        clock.advance(0.01)
        stats.latest["m"] = StepStats(step_duration=0.01, num_batched_tokens=10,
                                      num_waiting=sum(w[1] for w in waiting),
                                      waiting_by_priority=waiting)  # fmt: skip
        s.queued_ahead("m", 9)  # the gateway looks (it does at every decision)

    report(())  # the engine has not got request 1 yet
    assert s.queued_ahead("m", 1) == (1, 100)
    report(((1, 1, 100),))  # now it has; it is waiting
    assert s.queued_ahead("m", 1) == (1, 100)  # not counted twice
    clock.advance(0.001)
    s.enqueue(2, PAID, "m", 50)  # in transit
    assert s.queued_ahead("m", 1) == (2, 150)
    assert s.queued_ahead("m", 0) == (1, 50)
    report(((0, 1, 50), (1, 1, 100)))
    report(((1, 1, 100),))  # request 2 started (no first token yet: still in _queued)
    assert s.queued_ahead("m", 0) == (0, 0)
    assert s.queued_ahead("m", 2) == (1, 100)
    report(((1, 1, 100), (2, 3, 600)))
    assert s.queued_ahead("m", 2) == (4, 700)
