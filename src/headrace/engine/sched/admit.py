"""Starting waiting requests within a step's budget (who may is admission.py's policy).

In queue order, each candidate starts at its cached prefix and gets blocks for its next chunk.
A request whose prefix a running request is computing, or whose LoRA adapter has no turn yet,
waits a step without blocking the ones behind it; one that finds no room may preempt running
requests of a lower tier (running.py), or else the queue waits.
"""

from __future__ import annotations

from headrace.config import SchedulerConfig
from headrace.engine.kv.kv_manager import KVManager
from headrace.engine.sched.admission import ContinuousAdmission, StaticAdmission
from headrace.engine.sched.background import SitsOut
from headrace.engine.sched.running import RunningSet
from headrace.engine.sched.waiting_queue import WaitingQueue
from headrace.request import Request


class Admitter:
    def __init__(
        self,
        config: SchedulerConfig,
        kv: KVManager,
        queue: WaitingQueue,
        run: RunningSet,
        admission: ContinuousAdmission | StaticAdmission,
    ) -> None:
        self.config = config
        self.kv = kv
        self.queue = queue
        self.run = run
        self.admission = admission

    def admit(
        self,
        budget: int,
        plan: dict[str, int],
        preempted: set[str],
        now: float,
        sits_out: SitsOut,
    ) -> int:
        """Start waiting requests within `budget`, adding their tokens to `plan`; returns the
        budget left."""
        deferred: list[Request] = []  # waiting for a prefix that a running request computes
        lora_full = False  # an adapter waits for a turn: later adapters' requests wait behind it
        while budget > 0:
            req = self.admission.next_candidate(self.queue, now)
            # sits_out: the queue is in priority order, so the rest is background too
            if req is None or req.request_id in preempted or sits_out(req):
                break
            lora_waits = bool(req.lora_id) and (lora_full or not self.run.lora_fits(req))
            lora_full |= lora_waits  # no one overtakes it: its turn comes as adapters drain
            hit = None if lora_waits else self.kv.match(req)
            if hit is None:  # its adapter waits, or a running request computes its next block
                self.queue.remove(req)
                deferred.append(req)
                continue
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            refund = self._make_room(req, n, plan, preempted)
            if refund is None:
                break
            budget += refund
            if not self.kv.allocate(req, req.num_computed_tokens + n):
                self.kv.release(req)  # victims' blocks were shared after all: wait a step
                break
            self._start(req, hit, now)
            plan[req.request_id] = n
            budget -= n
        for req in deferred:
            self.queue.add(req)
        return budget

    def _make_room(
        self, req: Request, n: int, plan: dict[str, int], preempted: set[str]
    ) -> int | None:
        """Tokens that preempted requests give back to the budget (0: none needed), or None
        where `req` finds no room: its cache hit released, it waits its turn."""
        if self._room_for(req, n):
            return 0
        refund = None  # without priority preemption a request waits its turn
        if self.admission.allows_priority_preemption:
            refund = self.run.make_room(req, n, plan, preempted)
        if refund is None:
            self.kv.release(req)
        return refund

    def _start(self, req: Request, hit: int, now: float) -> None:
        if req is self.queue.peek():
            self.queue.pop()
        else:
            self.queue.remove(req)
        self.kv.admitted(req, hit, first=req.first_scheduled_time is None)
        if req.first_scheduled_time is None:
            req.first_scheduled_time = now
        self.run.add(req)

    def _room_for(self, req: Request, n: int) -> bool:
        running = self.run.requests
        if len(running) >= self.config.seqs_limit:
            return False
        return self.kv.has_room(req, n, others_running=bool(running))
