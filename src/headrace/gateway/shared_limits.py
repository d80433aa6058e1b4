"""Tenant limits shared by the front ends of one `--ray-namespace`: every limited tenant's
limiter reads a `Lease`, and one task settles all the leases with the `LimitsPool` actor every
`SYNC_S` (one Ray call for every tenant). Admission itself makes no Ray call.

If the pool cannot be reached (its actor died, the head is gone), admissions go on from what
the leases hold and what was free at the last sync; the next sync creates the actor again
(get-if-exists: the first front end to ask creates it, the others attach), with full buckets.

A reload of the tenants file (`gateway.reload`) renews the leases: a tenant with unchanged
limits keeps its lease, a new or changed one gets a new lease (the pool keys a tenant by its
limits, so it draws from a new pool), a removed one's lease is dropped (the pool forgets it
after `CLIENT_TIMEOUT_S`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from typing import Any

from headrace.gateway.gateway import TenantGateway
from headrace.gateway.lease import SYNC_S, Lease
from headrace.gateway.limits_actor import LimitsPool

log = logging.getLogger("headrace.gateway")

ACTOR_NAME = "headrace/limits"


class SharedLimits:
    """Use `await SharedLimits.start(gateway)` once Ray is connected; `close()` at the end."""

    def __init__(self, leases: list[Lease]) -> None:
        self.leases = leases
        self.client = uuid.uuid4().hex[:12]
        self._actor: Any = None
        self._task: asyncio.Task[None] | None = None
        self._failing = False

    @classmethod
    async def start(cls, gateway: TenantGateway) -> SharedLimits:
        shared = cls([])
        shared.refresh(gateway)
        if shared.leases:
            await shared.sync()
        shared._keep_syncing()
        gateway.reload_listeners.append(lambda: shared.renew(gateway))
        return shared

    def refresh(self, gateway: TenantGateway) -> None:
        """A lease for each limited tenant of `gateway`, kept where its limits are unchanged."""
        held = {id(lease.limiter): lease for lease in self.leases}
        leases = []
        for limiter in gateway.limiters.values():
            if not (limiter.tokens_per_minute or limiter.max_concurrent):
                continue
            lease = held.get(id(limiter))
            if lease is None or lease.limits != (limiter.tokens_per_minute, limiter.max_concurrent):
                lease = Lease(limiter)
                lease.install()
            leases.append(lease)
        self.leases = leases

    def renew(self, gateway: TenantGateway) -> None:
        """After a reload of `gateway`'s tenants file."""
        self.refresh(gateway)
        self._keep_syncing()

    def _keep_syncing(self) -> None:
        if self.leases and self._task is None:
            self._task = asyncio.create_task(self._loop(), name="headrace-shared-limits")

    async def sync(self) -> None:
        leases = self.leases  # a reload may replace the list while the actor answers
        messages = [lease.outgoing() for lease in leases]
        try:
            if self._actor is None:
                self._actor = await asyncio.to_thread(_pool_actor)
            grants = await self._actor.sync.remote(self.client, messages)
        except Exception as e:  # dead or unreachable: try again (and recreate) next time
            self._actor = None
            if not self._failing:
                log.error("the shared tenant limits are unreachable: %s", e)
            self._failing = True
            return
        if self._failing:
            log.warning("the shared tenant limits are reachable again")
        self._failing = False
        for lease, grant in zip(leases, grants, strict=True):
            lease.apply(grant)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(SYNC_S)
            await self.sync()

    async def close(self) -> None:
        """Stop syncing and hand back every lease (tokens and slots)."""
        if self._task is None:
            return
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
        for lease in self.leases:
            lease.seen_at = -float("inf")  # idle now: everything goes back
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.sync(), 5.0)


def _pool_actor() -> Any:
    """The namespace's pool: the live one, or a new one (detached, no CPU of its own)."""
    import ray

    pool_class = ray.remote(LimitsPool).options(
        name=ACTOR_NAME, lifetime="detached", get_if_exists=True, num_cpus=0, max_restarts=0
    )
    return pool_class.remote()
