"""The order in which waiting requests are admitted.

Two implementations: priority-then-arrival (`PriorityQueue`, the default) and per-tenant fair
sharing within a priority (`headrace.engine.sched.fair_queue.FairQueue`, used by the gateway).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Iterator
from typing import Protocol

from headrace.request import Request


class WaitingQueue(Protocol):
    """Contract: `peek` names the request to admit next without removing it; `pop` removes
    exactly that request. A preempted request re-enters with `add` and keeps its arrival time,
    so it goes back ahead of later arrivals of its class. `charge` tells the queue how many
    tokens a request was served in a step (prefill or decode), for fair-share accounting."""

    def add(self, req: Request) -> None: ...

    def peek(self) -> Request | None: ...

    def pop(self) -> Request: ...

    def remove(self, req: Request) -> None: ...

    def charge(self, req: Request, num_tokens: int) -> None: ...

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Request]: ...


class PriorityQueue:
    """Admit by priority (lower first), then arrival time; ties keep insertion order.

    A sorted list: queues hold hundreds of requests, and `__iter__` must walk them in
    admission order (the scheduler's stats and the gateway's wait estimates read it).
    """

    def __init__(self) -> None:
        self._items: list[tuple[int, float, int, Request]] = []
        self._seq = itertools.count()

    def add(self, req: Request) -> None:
        bisect.insort(self._items, (req.priority, req.arrival_time, next(self._seq), req))

    def peek(self) -> Request | None:
        return self._items[0][3] if self._items else None

    def pop(self) -> Request:
        return self._items.pop(0)[3]

    def remove(self, req: Request) -> None:
        for i, item in enumerate(self._items):
            if item[3] is req:
                del self._items[i]
                return
        raise KeyError(req.request_id)

    def charge(self, req: Request, num_tokens: int) -> None:
        """Strict priority keeps no service accounts."""

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Request]:
        return iter([item[3] for item in self._items])


def waiting_by_priority(waiting: Iterable[Request]) -> tuple[tuple[int, int, int], ...]:
    """(priority, count, work) per priority of `waiting`, work being the tokens still to
    compute and to generate (up to max_tokens): `StepStats.waiting_by_priority`."""
    totals: dict[int, list[int]] = {}
    for r in waiting:
        t = totals.setdefault(r.priority, [0, 0])
        t[0] += 1
        t[1] += r.num_tokens - r.num_computed_tokens + r.params.max_tokens - r.num_output_tokens
    return tuple((p, n, work) for p, (n, work) in sorted(totals.items()))
