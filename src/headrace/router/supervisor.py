"""Watches a model's replicas: takes failed or silent ones out of rotation, restarts local
ones with exponential backoff, lets remote ones rejoin once they answer again.

Every `interval_s` it looks at each replica. A local replica whose core process died, or that
reported nothing for `stall_timeout_s` (the core pushes stats at least every 0.5 s, so silence
means it hangs), is marked down — a hanging one is killed so its open streams end — and then
restarted: close the old engine, wait the backoff (doubling up to its maximum, back to the
start once a replica stayed healthy that long), start a new one. A failed start just waits
for the next turn with a longer backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence

from headrace.config import RouterConfig
from headrace.router.replica import Replica, ReplicaState

log = logging.getLogger("headrace.router")

CHECK_INTERVAL_S = 0.1
STARTUP_TIMEOUT_S = 600.0


class Supervisor:
    def __init__(
        self,
        replicas: Sequence[Replica],
        config: RouterConfig,
        interval_s: float = CHECK_INTERVAL_S,
        startup_timeout_s: float = STARTUP_TIMEOUT_S,
    ) -> None:
        self.replicas = list(replicas)
        self.config = config
        self.interval_s = interval_s
        self.startup_timeout_s = startup_timeout_s
        self._task: asyncio.Task[None] | None = None
        self._restarts: dict[str, asyncio.Task[None]] = {}  # by replica name

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._watch(), name="headrace-supervisor")

    async def close(self) -> None:
        tasks = [t for t in (self._task, *self._restarts.values()) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._task = None
        self._restarts.clear()

    async def _watch(self) -> None:
        while True:
            for replica in self.replicas:
                try:
                    self.check(replica)
                except Exception:  # one odd replica must not stop the watch over the others
                    log.exception("checking replica %s failed", replica.name)
            await asyncio.sleep(self.interval_s)

    def check(self, replica: Replica) -> None:
        if replica.state is ReplicaState.HEALTHY:
            replica.observe()
            stable_s = time.monotonic() - replica.healthy_since
            if replica.restart_attempts and stable_s > self.config.restart_backoff_max_s:
                replica.restart_attempts = 0  # it stayed up: the next failure starts afresh
            if not replica.engine.is_healthy:
                replica.mark_down(replica.engine.failure or "its engine is gone")
            elif replica.starter is not None and (
                replica.load.silent_for() > self.config.replica_stall_timeout_s
            ):
                replica.mark_down(
                    f"no report for {self.config.replica_stall_timeout_s:g} s; killing it"
                )
                replica.kill()
        if replica.state is ReplicaState.DOWN:
            if replica.starter is None:
                if replica.engine.is_healthy:  # a remote server answers again
                    replica.rejoin()
            elif replica.name not in self._restarts:
                self._restarts[replica.name] = asyncio.create_task(self._restart(replica))

    async def _restart(self, replica: Replica) -> None:
        assert replica.starter is not None
        replica.state = ReplicaState.RESTARTING
        try:
            try:
                await replica.engine.close()
            except Exception:
                log.warning("closing the failed engine of %s failed", replica.name, exc_info=True)
            delay = self._next_backoff(replica)
            log.warning("restarting replica %s in %.1f s", replica.name, delay)
            await asyncio.sleep(delay)
            try:
                engine = await asyncio.wait_for(replica.starter(), self.startup_timeout_s)
            except Exception as e:
                log.error("replica %s did not start: %s", replica.name, e)
                replica.last_error = f"restart failed: {e}"
                replica.state = ReplicaState.DOWN
                return
            replica.restarts += 1
            replica.attach(engine)
        finally:
            self._restarts.pop(replica.name, None)

    def _next_backoff(self, replica: Replica) -> float:
        cfg = self.config
        delay: float = min(
            cfg.restart_backoff_s * 2.0**replica.restart_attempts, cfg.restart_backoff_max_s
        )
        replica.restart_attempts += 1
        return delay
