"""A tenant's fair part of the queue: of a queue bound, and of the work it waits behind.

Pure arithmetic on what `LoadShedder` gathered; the engine's `FairQueue` (virtual token counters
per tenant within a priority) is what makes these shares real.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from headrace.gateway.tenant_queue import Backlog


@dataclass(frozen=True)
class Ahead:
    """What waits ahead of a new request of `tenant`: the queue really waiting at its
    priority and the more urgent ones (the engine's report plus requests in transit), and
    each tenant's backlog at its own priority as the gateway counts it."""

    tenant: str
    weight: float
    priority: int
    waiting: Mapping[int, tuple[int, int]]  # priority -> (requests, tokens), up to `priority`
    own: Backlog
    others: Mapping[str, Backlog]  # the other tenants queued at `priority`

    @property
    def n(self) -> int:
        return sum(n for n, _ in self.waiting.values())

    @property
    def tokens(self) -> int:
        return sum(t for _, t in self.waiting.values())

    @property
    def urgent_n(self) -> int:
        return sum(n for p, (n, _) in self.waiting.items() if p < self.priority)

    @property
    def urgent_tokens(self) -> int:
        return sum(t for p, (_, t) in self.waiting.items() if p < self.priority)

    @property
    def weights(self) -> float:
        """Of the tenants queued at this priority, this one (the newcomer) counted."""
        return self.weight + sum(b.weight for b in self.others.values())

    def share(self, bound: float, urgent: float) -> float:
        """This tenant's part of `bound`: what more urgent work leaves of it, by weight."""
        return max(0.0, bound - urgent) * self.weight / self.weights

    def request_quota(self, bound: int) -> int:
        """Requests this tenant may have queued when the queue is at `bound`: its share,
        rounded up (so that a share under one request still lets one in)."""
        # Less a hair: 7 * 0.1 / 0.7 is 1.0000000000000002, a share of 1 and not of 2.
        return math.ceil(self.share(bound, self.urgent_n) - 1e-9)

    def reconcile(self) -> tuple[float, int]:
        """(scale, unattributed): the gateway's backlogs at this priority scaled to what the
        engine reports really waiting there (requests started but without a first output
        are no longer waiting), and the reported tokens no backlog accounts for
        (preempted requests, which had started)."""
        counted = self.own.tokens + sum(b.tokens for b in self.others.values())
        real = self.waiting.get(self.priority, (0, 0))[1]
        if counted == 0:
            return 1.0, real
        return min(1.0, real / counted), max(0, real - counted)


def over_share(own: float, add: float, quota: float) -> bool:
    """Whether a tenant whose queue holds `own` may not add `add`: more urgent work fills the
    bound, or its queue would pass its quota. One with nothing queued gets one request in."""
    return quota <= 0 or (own > 0 and own + add > quota)


def fair_wait(
    own: float, new: float, weight: float, others: Iterable[tuple[float, float]]
) -> float:
    """Work a tenant's new request waits for at its priority under fair queueing: its own
    queued work, and of each other tenant's (work, weight) at most as much, by weight, as
    this tenant's own work with the new request."""
    mine = own + new
    return own + sum(min(work, mine * w / weight) for work, w in others)
