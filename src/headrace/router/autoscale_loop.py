"""The autoscaler at run time: every `interval_s` it samples the router's demand, asks the
policy (`autoscaler.Autoscaler`) for a replica count and has the `ReplicaSet` start or drain
replicas to match — one change at a time, timing each start for the policy's lead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from headrace.router.autoscaler import Autoscaler, Sample
from headrace.router.replica_set import ReplicaSet
from headrace.router.router import Router

log = logging.getLogger("headrace.router")


class AutoscaleLoop:
    def __init__(
        self,
        router: Router,
        replicas: ReplicaSet,
        policy: Autoscaler,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.router = router
        self.replicas = replicas
        self.policy = policy
        self.clock = clock
        self.interval_s = policy.config.autoscale_interval_s
        self.started = 0  # replicas this loop added
        self.removed = 0
        self._task: asyncio.Task[None] | None = None
        self._change: asyncio.Task[None] | None = None  # the scaling under way
        self._last = (clock(), router.tokens_delivered)
        self._was_waiting = False

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(
                self._run(), name=f"headrace-autoscale-{self.router.name}"
            )

    async def close(self) -> None:
        for task in (self._task, self._change):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self._task = self._change = None

    async def settle(self) -> None:
        """Wait for the scaling under way (tests)."""
        if self._change is not None:
            await asyncio.gather(self._change, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                self.tick()
            except Exception:  # a bad tick must not end autoscaling for good
                log.exception("autoscaler tick failed")

    def tick(self) -> None:
        """Sample, decide, and start the change (if none is under way)."""
        self.policy.observe(self.sample())
        if self._change is not None and not self._change.done():
            return
        current = self.replicas.size
        target = self.policy.target(current)
        if target > current:
            log.warning("autoscaler: %d -> %d replicas", current, target)
            self._change = asyncio.create_task(self._add(target - current))
        elif target < current:
            log.warning("autoscaler: %d -> %d replicas", current, target)
            self._change = asyncio.create_task(self._remove(current - target))

    def sample(self) -> Sample:
        now, tokens = self.clock(), self.router.tokens_delivered
        then, before = self._last
        self._last = (now, tokens)
        rate = (tokens - before) / (now - then) if now > then else 0.0
        serving = [r for r in self.router.replicas if r.serving]
        waiting = any(r.load.reported.num_waiting > 0 for r in serving)
        queued, self._was_waiting = waiting and self._was_waiting, waiting
        backlog = sum(
            work for r in serving for _, _, work in r.load.reported.waiting_by_priority or ()
        )
        return Sample(rate, len(serving), queued, float(backlog))

    async def _add(self, n: int) -> None:
        """Start `n` replicas at once; any failure backs the next try off (once per round)."""
        times = await asyncio.gather(*(self._add_one() for _ in range(n)))
        for seconds in times:
            if seconds is not None:
                self.policy.started(seconds)
                self.started += 1
        if None in times:
            self.policy.start_failed()

    async def _add_one(self) -> float | None:
        """The start time of one more replica; None if it did not start."""
        t0 = self.clock()
        try:
            await self.replicas.add()
        except Exception as e:
            log.error("autoscaler: a replica did not start: %s", e)
            return None
        return self.clock() - t0

    async def _remove(self, n: int) -> None:
        for _ in range(n):
            await self.replicas.remove()
            self.removed += 1

    def describe(self) -> dict[str, object]:
        return {**self.policy.describe(), "size": self.replicas.size,
                "started": self.started, "removed": self.removed}  # fmt: skip
