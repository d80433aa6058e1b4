"""Stored responses, for `previous_response_id`: each response's conversation (its input after
the previous one's, and its output), in memory, per tenant.

A tenant reads only its own: the key is (tenant, id), so another tenant's id is simply not
found (404, as an unknown one: the answer does not tell that it exists). Retention is bounded
by age (`ttl_s`), by count (`max_per_tenant`) and by size (`max_bytes_per_tenant`, the JSON
size of the conversations kept), oldest dropped first, so one tenant's conversations cannot
grow the server's memory without end or push out another's.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MAX_PER_TENANT = 1024
MAX_BYTES_PER_TENANT = 64 << 20
TTL_S = 3600.0


@dataclass(frozen=True)
class StoredResponse:
    messages: list[dict[str, Any]]  # the whole conversation, as chat messages
    stored_at: float
    nbytes: int = 0
    response: dict[str, Any] | None = None  # the response object, for GET /v1/responses/{id}


class _Kept(OrderedDict[str, StoredResponse]):
    """One tenant's responses, oldest first, with their total size."""

    nbytes = 0

    def add(self, response_id: str, stored: StoredResponse) -> None:
        self.pop_id(response_id)
        self[response_id] = stored
        self.nbytes += stored.nbytes

    def pop_id(self, response_id: str) -> None:
        old = self.pop(response_id, None)
        if old is not None:
            self.nbytes -= old.nbytes

    def pop_oldest(self) -> None:
        self.pop_id(next(iter(self)))


class ResponseStore:
    def __init__(
        self,
        max_per_tenant: int = MAX_PER_TENANT,
        ttl_s: float = TTL_S,
        max_bytes_per_tenant: int = MAX_BYTES_PER_TENANT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_per_tenant = max_per_tenant
        self.ttl_s = ttl_s
        self.max_bytes_per_tenant = max_bytes_per_tenant
        self._clock = clock
        self._by_tenant: dict[str, _Kept] = {}
        self._lock = threading.Lock()

    def put(
        self,
        tenant: str,
        response_id: str,
        messages: list[dict[str, Any]],
        response: dict[str, Any] | None = None,
    ) -> None:
        """Keep a conversation; one larger than a tenant's whole share is not kept."""
        nbytes = len(json.dumps([messages, response], ensure_ascii=False))
        if nbytes > self.max_bytes_per_tenant:
            return
        with self._lock:
            kept = self._by_tenant.setdefault(tenant, _Kept())
            kept.add(response_id, StoredResponse(messages, self._clock(), nbytes, response))
            self._expire(kept)
            while len(kept) > self.max_per_tenant or kept.nbytes > self.max_bytes_per_tenant:
                kept.pop_oldest()

    def get(self, tenant: str, response_id: str) -> StoredResponse | None:
        with self._lock:
            kept = self._by_tenant.get(tenant)
            if kept is None:
                return None
            self._expire(kept)
            return kept.get(response_id)

    def delete(self, tenant: str, response_id: str) -> bool:
        """Forget a response; False if the tenant has none by that id."""
        with self._lock:
            kept = self._by_tenant.get(tenant)
            if kept is None or response_id not in kept:
                return False
            kept.pop_id(response_id)
            return True

    def __len__(self) -> int:
        return sum(len(k) for k in self._by_tenant.values())

    def _expire(self, kept: _Kept) -> None:
        """Drop the entries past their age (the oldest are first)."""
        horizon = self._clock() - self.ttl_s
        while kept and next(iter(kept.values())).stored_at < horizon:
            kept.pop_oldest()
