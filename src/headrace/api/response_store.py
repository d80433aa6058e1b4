"""Stored responses, for `previous_response_id`: each response's conversation (its input after
the previous one's, and its output), in memory, per tenant.

A tenant reads only its own: the key is (tenant, id), so another tenant's id is simply not
found (404, as an unknown one: the answer does not tell that it exists). Retention is bounded
by age (`ttl_s`) and by count (`max_per_tenant`, oldest dropped first), so one tenant's
conversations cannot grow the server's memory without end or push out another's.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MAX_PER_TENANT = 1024
TTL_S = 3600.0


@dataclass(frozen=True)
class StoredResponse:
    messages: list[dict[str, Any]]  # the whole conversation, as chat messages
    stored_at: float


class ResponseStore:
    def __init__(
        self,
        max_per_tenant: int = MAX_PER_TENANT,
        ttl_s: float = TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_per_tenant = max_per_tenant
        self.ttl_s = ttl_s
        self._clock = clock
        self._by_tenant: dict[str, OrderedDict[str, StoredResponse]] = {}
        self._lock = threading.Lock()

    def put(self, tenant: str, response_id: str, messages: list[dict[str, Any]]) -> None:
        with self._lock:
            kept = self._by_tenant.setdefault(tenant, OrderedDict())
            kept[response_id] = StoredResponse(messages, self._clock())
            self._expire(kept)
            while len(kept) > self.max_per_tenant:
                kept.popitem(last=False)

    def get(self, tenant: str, response_id: str) -> StoredResponse | None:
        with self._lock:
            kept = self._by_tenant.get(tenant)
            if kept is None:
                return None
            self._expire(kept)
            return kept.get(response_id)

    def __len__(self) -> int:
        return sum(len(k) for k in self._by_tenant.values())

    def _expire(self, kept: OrderedDict[str, StoredResponse]) -> None:
        """Drop the entries past their age (the oldest are first)."""
        horizon = self._clock() - self.ttl_s
        while kept and next(iter(kept.values())).stored_at < horizon:
            kept.popitem(last=False)
