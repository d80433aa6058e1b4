"""The requests the gateway admitted whose first output has not arrived, by tenant.

Each tenant's part of the queue is counted here, per model and priority, so that shedding can
judge a tenant by its own backlog instead of charging it with everyone's. Updated at admission
and at start (or end), in O(1).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Queued:
    model: str
    priority: int
    tenant: str
    weight: float
    tokens: int  # prompt + max_tokens
    admitted_at: float


@dataclass
class Backlog:
    """One tenant's admitted, not yet started requests at one priority of one model."""

    weight: float
    count: int = 0
    tokens: int = 0


class TenantQueue:
    def __init__(self) -> None:
        self._queued: dict[int, Queued] = {}  # by ticket, in admission order
        self._backlogs: dict[tuple[str, int], dict[str, Backlog]] = {}  # (model, priority)

    def add(self, ticket: int, q: Queued) -> None:
        self._queued[ticket] = q
        level = self._backlogs.setdefault((q.model, q.priority), {})
        b = level.setdefault(q.tenant, Backlog(q.weight))
        b.weight, b.count, b.tokens = q.weight, b.count + 1, b.tokens + q.tokens

    def remove(self, ticket: int) -> bool:
        """True if the ticket was queued (the request had not started)."""
        q = self._queued.pop(ticket, None)
        if q is None:
            return False
        level = self._backlogs[(q.model, q.priority)]
        b = level[q.tenant]
        b.count, b.tokens = b.count - 1, b.tokens - q.tokens
        if b.count == 0:
            del level[q.tenant]
            if not level:
                del self._backlogs[(q.model, q.priority)]
        return True

    def backlogs(self, model: str, priority: int) -> Mapping[str, Backlog]:
        """Tenant -> its backlog at exactly `priority` (read only)."""
        return self._backlogs.get((model, priority), {})

    def priorities(self, model: str, up_to: int) -> list[int]:
        return sorted(p for m, p in self._backlogs if m == model and p <= up_to)

    def admitted_since(self, model: str, up_to: int, cutoff: float) -> dict[int, list[int]]:
        """Priority -> [requests, tokens] admitted at or after `cutoff`, at `up_to` or more
        urgent: the ones the engine's report may not include yet."""
        out: dict[int, list[int]] = {}
        # Newest first (dicts keep admission order): stop at the first the engine has seen.
        for q in reversed(self._queued.values()):
            if q.admitted_at < cutoff:
                break
            if q.model == model and q.priority <= up_to:
                level = out.setdefault(q.priority, [0, 0])
                level[0] += 1
                level[1] += q.tokens
        return out

    def __len__(self) -> int:
        return len(self._queued)
