"""The pool of every tenant's limits that front ends share: one named Ray actor
(`headrace/limits` in the `--ray-namespace`) that hands out leases (`gateway.lease`).

Per tenant (and its limits: front ends with other limits for a tenant get a pool of their
own) it keeps one token bucket refilled at the tenant's rate, and which front end holds how
many concurrency slots. A front end that has not synced for `CLIENT_TIMEOUT_S` is forgotten:
its slots go back to the pool (its tokens were spent or are lost; the bucket refills).

Plain class: `shared_limits` wraps it with `ray.remote`; tests drive it directly.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from headrace.gateway.lease import TenantGrant, TenantSync
from headrace.gateway.ratelimit import TokenBucket

CLIENT_TIMEOUT_S = 5.0  # fifty missed syncs

_Key = tuple[str, int | None, int | None]  # tenant, tokens per minute, max concurrent


@dataclass
class _Holder:
    synced_at: float
    active: bool
    slots: int = 0


@dataclass
class _TenantPool:
    bucket: TokenBucket | None
    max_concurrent: int | None
    holders: dict[str, _Holder] = field(default_factory=dict)  # by front end


class LimitsPool:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._pools: dict[_Key, _TenantPool] = {}

    def sync(self, client: str, tenants: list[TenantSync]) -> list[TenantGrant]:
        """One front end's leases, all tenants at once; grants in the same order."""
        return [self._sync_one(client, t) for t in tenants]

    def _sync_one(self, client: str, t: TenantSync) -> TenantGrant:
        now = self._clock()
        pool = self._pool(t)
        pool.holders[client] = _Holder(now, t.active, t.slots_held)
        for other, holder in list(pool.holders.items()):
            if now - holder.synced_at > CLIENT_TIMEOUT_S:
                del pool.holders[other]
        sharing = max(1, sum(1 for h in pool.holders.values() if h.active))
        tokens, pool_tokens, token_share = self._tokens(pool.bucket, t, sharing)
        slots, pool_slots, slot_share = self._slots(pool, client, t.active, sharing)
        return TenantGrant(tokens, pool_tokens, token_share, slots, pool_slots, slot_share)

    def _pool(self, t: TenantSync) -> _TenantPool:
        key = (t.tenant, t.tokens_per_minute, t.max_concurrent)
        pool = self._pools.get(key)
        if pool is None:
            tpm = t.tokens_per_minute
            bucket = TokenBucket(tpm, self._clock) if tpm else None
            pool = self._pools[key] = _TenantPool(bucket, t.max_concurrent)
        return pool

    @staticmethod
    def _tokens(
        bucket: TokenBucket | None, t: TenantSync, sharing: int
    ) -> tuple[float, float, float]:
        if bucket is None:
            return 0.0, 0.0, 0.0
        bucket.take(t.debt)  # admitted on credit: charged even below zero
        bucket.give(t.tokens_returned)
        share = bucket.capacity / sharing
        grant = 0.0
        if t.active:
            grant = max(0.0, min(share - t.tokens_held, bucket.level()))
            bucket.take(grant)
        return grant, bucket.level(), share

    @staticmethod
    def _slots(pool: _TenantPool, client: str, active: bool, sharing: int) -> tuple[int, int, int]:
        limit = pool.max_concurrent
        if limit is None:
            return 0, 0, 0
        holder = pool.holders[client]
        share = math.ceil(limit / sharing)
        free = limit - sum(h.slots for h in pool.holders.values())
        grant = max(0, min(share - holder.slots, free)) if active else 0
        holder.slots += grant
        return grant, free - grant, share
