"""Fair sharing between tenants within a priority: a virtual token counter per tenant.

After Sheng et al., "Fairness in Serving Large Language Models" (OSDI 2024): each tenant has a
counter of the service it received, tokens computed (prompt and output) divided by its weight.
The next request to admit is, within the most urgent priority that has waiting requests, the
oldest waiting request of the backlogged tenant with the smallest counter. A tenant that
becomes backlogged again is lifted to the smallest counter of the backlogged tenants (or, when
none is, to the counter of the tenant that left last), so being idle banks no credit. A tenant
sending ten times more requests therefore gets its weighted share, not ten times it.

With one tenant this is priority-then-arrival order, the same as `PriorityQueue`.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator

from headrace.request import Request

_Key = tuple[int, str]  # (priority, tenant)


class FairQueue:
    def __init__(self) -> None:
        # Each backlogged (priority, tenant): its waiting requests by (arrival, insertion).
        self._waiting: dict[_Key, list[tuple[float, int, Request]]] = {}
        self._counters: dict[_Key, float] = {}  # service / weight, never reset
        self._last_left: dict[int, _Key] = {}  # per priority: the last tenant to drain
        self._seq = itertools.count()
        self._len = 0
        self._order: list[Request] | None = None  # __iter__'s order, until the next change

    def add(self, req: Request) -> None:
        key = (req.priority, req.tenant)
        if key not in self._waiting:
            self._lift(key)
            self._waiting[key] = []
        bisect.insort(self._waiting[key], (req.arrival_time, next(self._seq), req))
        self._len += 1
        self._order = None

    def peek(self) -> Request | None:
        key = self._next_key()
        return None if key is None else self._waiting[key][0][2]

    def pop(self) -> Request:
        key = self._next_key()
        if key is None:
            raise IndexError("pop from an empty FairQueue")
        req = self._waiting[key].pop(0)[2]
        self._after_removal(key)
        return req

    def remove(self, req: Request) -> None:
        key = (req.priority, req.tenant)
        items = self._waiting.get(key, [])
        for i, item in enumerate(items):
            if item[2] is req:
                del items[i]
                self._after_removal(key)
                return
        raise KeyError(req.request_id)

    def charge(self, req: Request, num_tokens: int) -> None:
        key = (req.priority, req.tenant)
        self._counters[key] = self._counters.get(key, 0.0) + num_tokens / req.weight

    def counter(self, tenant: str, priority: int = 1) -> float:
        return self._counters.get((priority, tenant), 0.0)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Request]:
        """Waiting requests by priority, then arrival (not the fair order: that changes as
        counters move, and callers iterate to count, expire and estimate)."""
        if self._order is None:
            items = [(k[0], *item) for k, v in self._waiting.items() for item in v]
            self._order = [req for *_, req in sorted(items, key=lambda t: t[:3])]
        return iter(self._order)

    # -- internals -----------------------------------------------------------------------

    def _next_key(self) -> _Key | None:
        if not self._waiting:
            return None
        top = min(p for p, _ in self._waiting)
        # Smallest counter; ties go to the tenant whose oldest request arrived first.
        return min(
            (k for k in self._waiting if k[0] == top),
            key=lambda k: (self._counters.get(k, 0.0), self._waiting[k][0][:2]),
        )

    def _lift(self, key: _Key) -> None:
        """No banking credit: a newly backlogged tenant starts at the backlogged minimum."""
        floor = self._min_backlogged(key[0])
        if floor is None:
            # Nobody waits at this level: as the paper, take the counter of the last tenant
            # that left it (still growing while its requests run).
            last = self._last_left.get(key[0])
            floor = self._counters.get(last, 0.0) if last is not None else 0.0
        self._counters[key] = max(self._counters.get(key, 0.0), floor)

    def _after_removal(self, key: _Key) -> None:
        self._len -= 1
        self._order = None
        if not self._waiting[key]:
            del self._waiting[key]
            self._last_left[key[0]] = key

    def _min_backlogged(self, priority: int) -> float | None:
        counters = [self._counters.get(k, 0.0) for k in self._waiting if k[0] == priority]
        return min(counters) if counters else None
