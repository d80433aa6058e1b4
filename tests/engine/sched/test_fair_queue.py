"""FairQueue: virtual token counters per tenant within a priority (Sheng et al., OSDI 2024)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from headrace.engine.sched.fair_queue import FairQueue
from headrace.engine.sched.waiting_queue import PriorityQueue
from headrace.request import Request


def _req(
    make_request,
    rid: str,
    tenant: str,
    priority: int = 1,
    arrival: float = 0.0,
    weight: float = 1.0,
) -> Request:
    req = make_request(rid, priority=priority, arrival=arrival)
    req.tenant, req.weight = tenant, weight
    return req


def test_one_tenant_is_priority_then_arrival(make_request) -> None:
    rng = random.Random(7)
    reqs = [
        make_request(f"r{i}", priority=rng.randint(0, 2), arrival=rng.choice([0.0, 1.0, 2.0]))
        for i in range(40)
    ]
    fair, plain = FairQueue(), PriorityQueue()
    for r in reqs:
        fair.add(r)
        plain.add(r)
    assert [r.request_id for r in fair] == [r.request_id for r in plain]
    popped = []
    while len(fair):
        assert fair.peek() is plain.peek()
        popped.append(fair.pop())
        fair.charge(popped[-1], 10)
        plain.pop()
    assert len(popped) == 40 and fair.peek() is None
    with pytest.raises(IndexError):
        fair.pop()


def test_smallest_counter_first_within_the_most_urgent_priority(make_request) -> None:
    q = FairQueue()
    a1, a2 = _req(make_request, "a1", "A"), _req(make_request, "a2", "A", arrival=1.0)
    b1 = _req(make_request, "b1", "B", arrival=2.0)
    batch = _req(make_request, "x", "C", priority=2)
    for r in (batch, a1, a2, b1):
        q.add(r)
    assert q.peek() is a1  # tie at 0: the oldest head goes first
    q.charge(q.pop(), 100)
    assert q.pop() is b1  # A is at 100, B at 0
    q.charge(b1, 30)
    assert q.pop() is a2  # B not backlogged any more: A is the only one
    paid = _req(make_request, "p", "P", priority=0, arrival=9.0)
    q.add(paid)
    assert q.pop() is paid  # priority before fairness
    assert q.pop() is batch
    assert len(q) == 0


def test_weights_divide_the_charge(make_request) -> None:
    q = FairQueue()
    q.charge(_req(make_request, "h", "heavy", weight=2.0), 100)
    q.charge(_req(make_request, "l", "light"), 100)
    assert q.counter("heavy") == 50 and q.counter("light") == 100


def test_no_banking_credit_while_idle(make_request) -> None:
    q = FairQueue()
    a = [_req(make_request, f"a{i}", "A", arrival=i) for i in range(3)]
    for r in a:
        q.add(r)
    q.charge(q.pop(), 1000)  # A served 1000 tokens while B was idle
    late = _req(make_request, "b", "B", arrival=5.0)
    q.add(late)
    # B is lifted to A's counter, not left at 0: it does not get 1000 tokens of priority.
    assert q.counter("B") == 1000
    assert q.peek() is a[1]  # tie at 1000: A's head is older
    q.remove(a[1])
    q.remove(a[2])
    with pytest.raises(KeyError):
        q.remove(a[2])
    q.pop()  # B leaves; the level is empty
    q.charge(late, 500)  # B's request runs on: its counter keeps growing
    q.add(_req(make_request, "c", "C", arrival=9.0))
    assert q.counter("C") == 1500  # lifted to the last tenant to leave


def test_preempted_request_goes_back_ahead_of_its_tenants_later_ones(make_request) -> None:
    q = FairQueue()
    early, late = (
        _req(make_request, "e", "A", arrival=1.0),
        _req(make_request, "l", "A", arrival=2.0),
    )
    q.add(late)
    q.add(early)  # re-enters after preemption with its arrival time
    assert q.pop() is early


def _served_while_both_backlogged(engine, tenants: dict[str, str]) -> Counter[str]:
    """Tokens computed per tenant over the steps at whose start both tenants had waiting
    requests (the window the fairness claim is about)."""
    served: Counter[str] = Counter()
    while engine.core.has_work():
        waiting = {tenants[r.request_id] for r in engine.core.scheduler.queue}
        engine.step()
        if len(waiting) == 2:
            for s in engine.runner.steps[-1].scheduled:
                served[tenants[s.request_id]] += len(s.token_ids)
    return served


def _flood(fake_engine, make_prompt, queue, weights: dict[str, float]) -> Counter[str]:
    """Tenant "flood" offers 10x the requests of tenant "calm", all of it arriving first."""
    engine = fake_engine(queue=queue, max_num_seqs=4, max_num_batched_tokens=32)
    tenants = {}
    for i, tenant in enumerate(["flood"] * 100 + ["calm"] * 10):
        rid = f"{tenant}{i}"
        tenants[rid] = tenant
        engine.add(
            rid,
            make_prompt(i, 6 + i % 7),
            max_tokens=12 + i % 9,
            ignore_eos=True,
            temperature=0.0,
            tenant=tenant,
            weight=weights[tenant],
        )
    served = _served_while_both_backlogged(engine, tenants)
    assert len(engine.finished) == 110 and engine.core.block_manager.num_used_blocks == 0
    return served


def test_a_flooding_tenant_gets_no_more_than_its_share(fake_engine, make_prompt) -> None:
    served = _flood(fake_engine, make_prompt, FairQueue(), {"flood": 1.0, "calm": 1.0})
    assert served["calm"] > 200  # a real window, not a few steps
    assert served["flood"] == pytest.approx(served["calm"], rel=0.2)
    # The same load in arrival order: the flood takes everything while calm waits.
    fifo = _flood(fake_engine, make_prompt, PriorityQueue(), {"flood": 1.0, "calm": 1.0})
    assert fifo["calm"] == 0 and fifo["flood"] > 1000


def test_weighted_shares(fake_engine, make_prompt) -> None:
    served = _flood(fake_engine, make_prompt, FairQueue(), {"flood": 1.0, "calm": 2.0})
    assert served["calm"] / served["flood"] == pytest.approx(2.0, rel=0.2)


def test_tiers_on_the_scheduler(fake_engine, make_prompt) -> None:
    """Paid goes before every waiting free request; batch starts only when no more urgent
    request is waiting; fair sharing among the free tenants does not change either."""
    engine = fake_engine(queue=FairQueue(), max_num_seqs=3, max_num_batched_tokens=24)
    tier = {}

    def add(rid: str, tenant: str, priority: int, n: int) -> None:
        tier[rid] = priority
        engine.add(
            rid,
            make_prompt(len(tier), 5),
            max_tokens=n,
            ignore_eos=True,
            temperature=0.0,
            tenant=tenant,
            priority=priority,
        )

    for i in range(8):
        add(f"free{i}", f"f{i % 2}", 1, 20)
    for i in range(4):
        add(f"batch{i}", "b", 2, 5)
    sched = engine.core.scheduler
    started: dict[str, int] = {}
    for step in range(400):
        if step == 5:
            add("paid", "p", 0, 5)
        waiting_before = {r.request_id for r in sched.queue}
        if not engine.core.has_work():
            break
        engine.step()
        still_waiting = {r.request_id for r in sched.queue}
        new = {s.request_id for s in engine.runner.steps[-1].scheduled} - set(started)
        for rid in new:
            started[rid] = step
            # No request of a more urgent tier that was waiting was left waiting.
            assert not {w for w in waiting_before & still_waiting if tier[w] < tier[rid]}, rid
    assert len(engine.finished) == 13 and sched.blocks.num_used_blocks == 0
    assert started["paid"] == 5  # admitted in the step right after it arrived (preempting)
    assert all(started[f"free{i}"] > 5 for i in range(3, 8))  # earlier arrivals, still waiting
    assert min(started[f"batch{i}"] for i in range(4)) > max(started[f"free{i}"] for i in range(8))


def test_step_stats_report_the_waiting_work_per_priority(fake_engine, make_prompt) -> None:
    engine = fake_engine(queue=FairQueue(), max_num_seqs=1)
    engine.add("a", make_prompt(1, 5), max_tokens=10, priority=1, tenant="x")
    engine.step()  # "a" runs; the rest wait
    engine.add("b", make_prompt(2, 6), max_tokens=4, priority=1, tenant="y")
    engine.add("c", make_prompt(3, 7), max_tokens=3, priority=2, tenant="z")
    engine.add("d", make_prompt(4, 2), max_tokens=1, priority=1, tenant="x")
    engine.step()
    assert engine.stats[-1].waiting_by_priority == ((1, 2, 6 + 4 + 2 + 1), (2, 1, 7 + 3))
    engine.run()
    assert engine.stats[-1].waiting_by_priority == ()
    steps = engine.runner.steps
    assert engine.stats[-1].num_tokens_total == sum(o.num_batched_tokens for o in steps) > 0
