"""A model's replicas as a set that grows and shrinks at run time: what the autoscaler drives.

`ReplicaSet` is the contract; `LocalReplicaSet` implements it with replicas made by the
router's starter: engine-core processes on this machine, or Ray actors with `--ray-address`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import Protocol

from headrace.router.replica import Replica, ReplicaState, Starter
from headrace.router.router import Router
from headrace.router.supervisor import STARTUP_TIMEOUT_S

log = logging.getLogger("headrace.router")

DRAIN_POLL_S = 0.1
DRAIN_TIMEOUT_S = 120.0  # then it is closed anyway: its open streams resume elsewhere


class ReplicaSet(Protocol):
    @property
    def size(self) -> int:
        """Replicas serving, down for a restart or starting; not those being drained."""
        ...

    async def add(self) -> None:
        """Start one replica; return once it is in rotation; raise if it cannot start."""
        ...

    async def remove(self) -> None:
        """Take one replica out of rotation, let its requests finish, stop it."""
        ...


class LocalReplicaSet:
    """The main-pool replicas of one router, as `starter` makes them."""

    def __init__(
        self, router: Router, starter: Starter, drain_timeout_s: float = DRAIN_TIMEOUT_S
    ) -> None:
        self.router = router
        self.starter = starter
        self.drain_timeout_s = drain_timeout_s
        self._starting = 0
        self._names = itertools.count(len(router.replicas))

    @property
    def size(self) -> int:
        return self._starting + len(self._members())

    async def add(self) -> None:
        self._starting += 1
        try:
            engine = await asyncio.wait_for(self.starter(), STARTUP_TIMEOUT_S)
        finally:
            self._starting -= 1
        replica = Replica(f"{self.router.name}/{next(self._names)}", engine, starter=self.starter)
        self.router.add_replica(replica)
        log.warning("autoscaler: replica %s joined", replica.name)

    async def remove(self) -> None:
        healthy = [r for r in self._members() if r.state is ReplicaState.HEALTHY]
        if len(healthy) < 2:
            return  # never drain the last one serving
        replica = min(healthy, key=lambda r: (r.in_flight, r.load.load_tokens))
        replica.state = ReplicaState.DRAINING
        log.warning("autoscaler: draining replica %s", replica.name)
        deadline = time.monotonic() + self.drain_timeout_s
        while replica.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)
        self.router.remove_replica(replica)
        await replica.engine.close()

    def _members(self) -> list[Replica]:
        return [
            r for r in self.router.replicas
            if r.pool == "main" and r.starter is not None and r.state is not ReplicaState.DRAINING
        ]  # fmt: skip
