"""The running requests in rank order (priority, then arrival), and taking them off again.

Preemption frees a request's blocks and sends it back to wait; it is recomputed later, never
dropped. Within a step, `plan` maps request id -> tokens scheduled so far and `preempted`
names the requests taken off in it (they do not come back in the same step).
"""

from __future__ import annotations

from collections.abc import Callable

from headrace.config import SchedulerConfig
from headrace.engine.kv.block_manager import BlockManager
from headrace.engine.sched.preemption import victims_to_admit
from headrace.engine.sched.waiting_queue import WaitingQueue
from headrace.request import Request, RequestStatus


def _rank(req: Request) -> tuple[int, float]:
    return (req.priority, req.arrival_time)


class RunningSet:
    def __init__(self, blocks: BlockManager, queue: WaitingQueue, config: SchedulerConfig) -> None:
        self.blocks = blocks
        self.queue = queue
        self.config = config
        self.requests: list[Request] = []  # in rank order
        self.num_preemptions_total = 0
        # Whether an adapter's weights are in memory, made so if they can be (the core's
        # `LoraResidency.ready`, --max-cpu-loras); asked last, of a request that fits the step
        self.lora_ready: Callable[[Request], bool] = lambda req: True

    def lora_fits(self, req: Request) -> bool:
        """A request of a LoRA adapter runs only while at most `max_loras` adapters do, and
        once its adapter's weights are in memory."""
        if not req.lora_id:
            return True
        active = {r.lora_id for r in self.requests if r.lora_id}
        fits = req.lora_id in active or len(active) < self.config.max_loras
        return fits and self.lora_ready(req)

    def add(self, req: Request) -> None:
        req.status = RequestStatus.RUNNING
        self.requests.append(req)
        self.requests.sort(key=_rank)

    def plan(
        self,
        budget: int,
        plan: dict[str, int],
        preempted: set[str],
        draft: Callable[[Request, int], int] | None,
        sits_out: Callable[[Request], bool],
    ) -> int:
        """The running requests' tokens within `budget`, in rank order, decodes first so that
        a long prompt's chunks never stall running streams; `draft(req, budget)` adds a
        decoding request's drafts; a request that `sits_out` gets none this step. Returns the
        budget left."""
        chunks: list[Request] = []  # those with prompt tokens left, in rank order: after decodes
        for req in list(self.requests):
            if budget == 0:
                return 0
            if req.num_tokens - req.num_computed_tokens != 1:
                chunks.append(req)
            elif self._may_grow(req, plan, preempted, sits_out):
                n = 1 + (draft(req, budget) if draft is not None else 0)
                budget -= self.grow(req, n, plan, preempted)
        for req in chunks:  # a preemption above may have taken one: `preempted` says so
            if budget == 0:
                break
            if self._may_grow(req, plan, preempted, sits_out):
                n = min(req.num_tokens - req.num_computed_tokens, budget)
                budget -= self.grow(req, n, plan, preempted)
        return budget

    @staticmethod
    def _may_grow(
        req: Request, plan: dict[str, int], preempted: set[str], sits_out: Callable[[Request], bool]
    ) -> bool:
        rid = req.request_id
        return rid not in plan and rid not in preempted and not sits_out(req)

    def grow(self, req: Request, n: int, plan: dict[str, int], preempted: set[str]) -> int:
        """Give a running request up to `n` tokens, preempting lower-ranked ones for blocks.

        Returns the budget consumed net of what preempted requests gave back.
        """
        start = req.num_computed_tokens
        if self.blocks.covers(req.request_id, start + n):  # most decode steps: no new block
            plan[req.request_id] = n
            return n
        refund = 0
        while not self.blocks.can_fit(req.request_id, start + n):
            victim = self.requests[-1]
            if victim is req:
                # Nobody ranks lower: take the blocks that are free; if none, wait a step.
                n = min(n, self.blocks.max_tokens_fitting(req.request_id) - start)
                if n <= 0:
                    return -refund
                break
            refund += self.preempt(victim, plan, preempted)
        self.blocks.allocate(req.request_id, start + n)
        plan[req.request_id] = n
        return n - refund

    def make_room(
        self, req: Request, n: int, plan: dict[str, int], preempted: set[str]
    ) -> int | None:
        """Preempt running requests of a lower tier to admit `req`, if that makes room.

        Returns the budget the victims gave back, or None when no such room can be made.
        Each victim is preempted at most `max_preemptions` times, so it cannot thrash.
        """
        victims = victims_to_admit(self.requests, req, n, self.blocks, self.config)
        if victims is None:
            return None
        return sum(self.preempt(victim, plan, preempted) for victim in victims)

    def preempt(self, victim: Request, plan: dict[str, int], preempted: set[str]) -> int:
        """Free the victim's blocks and send it back to wait; returns the budget it held."""
        self.requests.remove(victim)
        self.blocks.free(victim.request_id)
        victim.drop_pending()  # its launched step's token is dropped: recomputed, drawn again
        victim.num_recomputed_tokens += victim.num_computed_tokens
        victim.num_computed_tokens = 0
        victim.status = RequestStatus.PREEMPTED
        victim.num_preemptions += 1
        self.num_preemptions_total += 1
        self.queue.add(victim)
        preempted.add(victim.request_id)
        return plan.pop(victim.request_id, 0)
