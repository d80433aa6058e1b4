"""The scheduler: which requests compute how many tokens in the next model step.

It schedules tokens, not phases. Each step, within a token budget, a cap on running requests
and the free KV blocks: running requests' decode tokens first, then their prompt chunks, then
waiting requests in queue order (priority, then arrival; background ones sit out a step with a
more urgent prompt: background.py). A request that cannot get a block preempts the
lowest-ranked running request, which is recomputed later; it is never dropped."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from functools import partial

from headrace.config import SchedulerConfig
from headrace.engine.kv.block_manager import BlockManager
from headrace.engine.kv.kv_manager import KVManager
from headrace.engine.limits import check_fits
from headrace.engine.messages import RequestOutput, StepStats
from headrace.engine.outputs import RunnerOutput, ScheduledRequest, SchedulerOutput
from headrace.engine.sched import background as bg
from headrace.engine.sched import request_report as report
from headrace.engine.sched.admission import make_admission
from headrace.engine.sched.fair_queue import FairQueue
from headrace.engine.sched.running import RunningSet
from headrace.engine.sched.speculation import accept
from headrace.engine.sched.speculator import Speculator
from headrace.engine.sched.step_budget import StepBudget
from headrace.engine.sched.step_plan import prompt_tokens, scheduled_request
from headrace.engine.sched.step_stats import collect_stats
from headrace.engine.sched.stop_checker import append_until_stop
from headrace.engine.sched.waiting_queue import WaitingQueue
from headrace.request import Request, RequestStatus

log = logging.getLogger(__name__)


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        block_manager: BlockManager,
        max_model_len: int,
        queue: WaitingQueue | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.blocks = block_manager
        self.kv = KVManager(block_manager)
        self.max_model_len = max_model_len
        # Fair sharing between tenants within a priority; with one tenant it is exactly
        # priority-then-arrival order (PriorityQueue).
        self.queue: WaitingQueue = queue if queue is not None else FairQueue()
        self.clock = clock
        self.admission = make_admission(config)
        base = config.max_num_batched_tokens
        self.budget = StepBudget(base, config.burst_batched_tokens or base)
        self.requests: dict[str, Request] = {}  # every unfinished request
        self.run = RunningSet(block_manager, self.queue, config)
        self.num_tokens_total = 0  # computed in all steps so far: the gateway's throughput
        self._pending: list[RequestOutput] = []  # finished outside a step (abort, deadline)
        self._finished_ids: list[str] = []  # for the runner to drop their state
        self._last_prefill = 0  # prompt tokens in the last scheduled step
        self.spec = Speculator(config, max_model_len)
        self.yields = bg.BackgroundYield(config.background_priority)  # background sits out

    def add_request(self, req: Request) -> None:
        if req.request_id in self.requests:
            raise ValueError(f"request id {req.request_id!r} is already in use")
        check_fits(
            req.num_prompt_tokens,
            req.params.max_tokens,
            self.max_model_len,
            self.blocks.capacity_tokens,
        )
        req.status = RequestStatus.WAITING
        self.queue.add(req)  # first: if it raises, the request is nowhere
        self.requests[req.request_id] = req

    def abort_request(self, request_id: str) -> bool:
        req = self.requests.get(request_id)
        if req is None:
            return False
        self._end(req, RequestStatus.FINISHED_ABORTED)
        return True

    def emit(self, output: RequestOutput) -> None:
        """Report `output` with the next step (e.g. for a request refused at the door)."""
        self._pending.append(output)

    def fail(self, request_ids: Iterable[str], error: str) -> None:
        """End these requests with `error` (unknown or finished ids are skipped)."""
        for rid in list(request_ids):
            req = self.requests.get(rid)
            if req is not None:
                self._end(req, RequestStatus.FINISHED_ERROR, error)

    def take_outputs(self) -> list[RequestOutput]:
        """The outputs that finished outside a step, now (after a step that broke down)."""
        outputs, self._pending = self._pending, []
        return outputs

    def has_work(self) -> bool:
        return bool(self.requests) or bool(self._pending)

    @property
    def num_waiting(self) -> int:
        return len(self.queue)

    def schedule(self) -> SchedulerOutput:
        now = self.clock()
        self._expire(now)
        plan: dict[str, int] = {}  # request id -> tokens this step, in scheduling order
        budget = self.budget.next(self.running, self.queue)
        preempted: set[str] = set()
        draft = self._draft if self.spec.begin_step(len(self.running)) else None
        yields = self.yields.sits_out(self.running, self.queue)
        sits_out = yields or bg.nobody
        for _ in range(2):  # the second pass only if the urgent prompt could not start
            budget = self.run.plan(budget, plan, preempted, draft, sits_out)
            budget = self._admit(budget, plan, preempted, now, sits_out)
            planned = (self.requests[rid] for rid in plan)
            if yields is None or not self.yields.given_back(planned, self.running):
                break
            sits_out = bg.nobody
        return self._build_output(plan, now)

    def _draft(self, req: Request, budget: int) -> int:
        return self.spec.draft(req, budget, partial(self.blocks.can_fit, req.request_id))

    def update(self, out: SchedulerOutput, result: RunnerOutput) -> list[RequestOutput]:
        self.num_tokens_total += out.num_batched_tokens
        for s in out.scheduled:
            req = self.requests.get(s.request_id)
            if req is None or req.status is not RequestStatus.RUNNING:
                continue
            try:
                self._update_one(req, s, result)
            except Exception as e:  # one request's bad output must not end the others
                log.exception("updating request %s failed", s.request_id)
                self.fail([s.request_id], f"engine error: {type(e).__name__}: {e}")
        return self.take_outputs()

    def _update_one(self, req: Request, s: ScheduledRequest, result: RunnerOutput) -> None:
        token = result.sampled.get(s.request_id) if s.sample else None
        drafts = s.draft_token_ids
        new = (
            [] if token is None else accept(token, drafts, result.draft_picks.get(s.request_id, []))
        )
        status, emitted = append_until_stop(req, new, self.max_model_len)
        # KV entries hold the tokens up to the last known one and the accepted drafts; those of
        # rejected drafts lie past them, and the next step overwrites them.
        computed = s.start_pos + len(s.token_ids) - len(drafts) + max(0, len(new) - 1)
        req.num_computed_tokens = min(computed, req.num_tokens)
        if drafts:
            self.spec.settle(req, len(drafts), max(0, len(new) - 1))
        self.kv.computed(req, drafted=bool(drafts))
        if not s.sample:
            return
        if token is None:
            self._end(req, *report.ended_without_token(req.request_id, result))
            return
        if req.first_token_time is None:
            req.first_token_time = self.clock()
        if status is not None:
            self._finish(req, status)
        lp = result.logprobs.get(s.request_id)
        self._pending.append(report.request_output(req, emitted, logprobs=[lp] if lp else []))

    def _admit(
        self,
        budget: int,
        plan: dict[str, int],
        preempted: set[str],
        now: float,
        sits_out: bg.SitsOut,
    ) -> int:
        deferred: list[Request] = []  # waiting for a prefix that a running request computes
        lora_full = False  # an adapter waits for a turn: later adapters' requests wait behind it
        while budget > 0:
            req = self.admission.next_candidate(self.queue, now)
            if req is None or req.request_id in preempted:
                break
            if sits_out(req):
                break  # the queue is in priority order: the rest is background too
            if req.lora_id and (lora_full or not self.run.lora_fits(req)):
                lora_full = True  # no one overtakes it: its turn comes as adapters drain
                self.queue.remove(req)
                deferred.append(req)
                continue
            hit = self.kv.match(req)
            if hit is None:  # a running request computes its next block: a hit soon
                self.queue.remove(req)
                deferred.append(req)
                continue
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            if not self._room_for(req, n):
                refund = None  # without priority preemption a request waits its turn
                if self.admission.allows_priority_preemption:
                    refund = self.run.make_room(req, n, plan, preempted)
                if refund is None:
                    self.kv.release(req)
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
        if len(self.running) >= self.config.seqs_limit:
            return False
        return self.kv.has_room(req, n, others_running=bool(self.running))

    def _build_output(self, plan: dict[str, int], now: float) -> SchedulerOutput:
        scheduled = []
        self._last_prefill = 0
        for rid, n in plan.items():
            req = self.requests[rid]
            drafts = self.spec.take(rid, n)
            s = scheduled_request(req, n - len(drafts), drafts, self.blocks.block_table(rid))
            self._last_prefill += prompt_tokens(s, req)
            scheduled.append(s)
            self.queue.charge(req, n)
        finished: list[str] = []
        if scheduled:  # an empty step is not run: keep the ids for the next one
            finished, self._finished_ids = self._finished_ids, []
        return SchedulerOutput(scheduled=scheduled, finished_ids=finished)

    def _expire(self, now: float) -> None:
        for req in list(self.requests.values()):
            status = report.expired_status(req, now)
            if status is not None:
                self._end(req, status)

    def _end(self, req: Request, status: RequestStatus, error: str | None = None) -> None:
        """Finish `req` outside a step's tokens; its last output goes with the next step."""
        self._finish(req, status)
        self._pending.append(report.request_output(req, [], error=error))

    def _finish(self, req: Request, status: RequestStatus) -> None:
        if req in self.running:
            self.running.remove(req)
        else:
            self.queue.remove(req)
        self.blocks.free(req.request_id)
        req.status = status
        del self.requests[req.request_id]
        self._finished_ids.append(req.request_id)
        self.admission.on_finish(req)

    @property
    def running(self) -> list[Request]:
        """The running requests in rank order: priority, then arrival."""
        return self.run.requests

    @property
    def num_preemptions_total(self) -> int:
        return self.run.num_preemptions_total

    @property
    def prefix_hits_total(self) -> int:
        return self.kv.prefix_hits_total

    @property
    def spec_drafted_total(self) -> int:
        return self.spec.drafted_total

    @property
    def spec_accepted_total(self) -> int:
        return self.spec.accepted_total

    def stats(self, out: SchedulerOutput | None = None, step_duration: float = 0.0) -> StepStats:
        """Gauges now, with the token counts of `out` (the step just run), if given."""
        batched = out.num_batched_tokens if out is not None else 0
        return collect_stats(
            self.running, self.queue, self.blocks, self.num_preemptions_total,
            batched, min(self._last_prefill, batched), step_duration, self.num_tokens_total,
            (self.kv.prefix_queries_total, self.kv.prefix_hits_total),
            (self.spec.drafted_total, self.spec.accepted_total),
        )  # fmt: skip
