from __future__ import annotations

from headrace.engine.sched.waiting_queue import PriorityQueue


def test_priority_then_arrival_order(make_request) -> None:
    q = PriorityQueue()
    reqs = [
        make_request("free-late", priority=1, arrival=3.0),
        make_request("batch", priority=2, arrival=0.0),
        make_request("paid", priority=0, arrival=5.0),
        make_request("free-early", priority=1, arrival=1.0),
    ]
    for r in reqs:
        q.add(r)
    assert [r.request_id for r in q] == ["paid", "free-early", "free-late", "batch"]
    assert q.peek() is not None and q.peek().request_id == "paid"
    assert q.pop().request_id == "paid"
    q.remove(reqs[0])
    assert [r.request_id for r in q] == ["free-early", "batch"]
    assert len(q) == 2


def test_a_preempted_request_goes_back_ahead_of_later_arrivals(make_request) -> None:
    q = PriorityQueue()
    early = make_request("early", arrival=1.0)
    q.add(make_request("late", arrival=2.0))
    q.add(early)  # re-enters after preemption, keeps its arrival time
    assert q.pop() is early
