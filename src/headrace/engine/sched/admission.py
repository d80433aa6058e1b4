"""Who may join the running batch: continuous batching (anyone, any step) or static batching.

Static batching is the older policy, kept so the benchmark can show what continuous batching
buys: wait for `static_batch_size` requests or `static_wait_ms`, whichever comes first, then
run that batch to completion with no joins.
"""

from __future__ import annotations

from headrace.config import SchedulerConfig
from headrace.engine.sched.waiting_queue import WaitingQueue
from headrace.request import Request


class ContinuousAdmission:
    """Any waiting request may join at any step; a higher tier may preempt a lower one."""

    allows_priority_preemption = True

    def next_candidate(self, queue: WaitingQueue, now: float) -> Request | None:
        return queue.peek()

    def on_finish(self, req: Request) -> None:
        pass


class StaticAdmission:
    allows_priority_preemption = False

    def __init__(self, batch_size: int, wait_s: float) -> None:
        self.batch_size = batch_size
        self.wait_s = wait_s
        self._batch: set[str] = set()  # members of the batch in flight, until each finishes

    def next_candidate(self, queue: WaitingQueue, now: float) -> Request | None:
        """The first waiting member of the batch in flight (a preempted member rejoins)."""
        if not self._batch:
            self._form_batch(list(queue), now)
        return next((r for r in queue if r.request_id in self._batch), None)

    def on_finish(self, req: Request) -> None:
        self._batch.discard(req.request_id)

    def _form_batch(self, waiting: list[Request], now: float) -> None:
        if not waiting:
            return
        oldest = min(r.arrival_time for r in waiting)
        if len(waiting) >= self.batch_size or now - oldest >= self.wait_s:
            self._batch = {r.request_id for r in waiting[: self.batch_size]}


def make_admission(config: SchedulerConfig) -> ContinuousAdmission | StaticAdmission:
    if config.policy == "static":
        return StaticAdmission(config.static_batch_size, config.static_wait_ms / 1000)
    return ContinuousAdmission()
