"""The scheduler: which requests compute how many tokens in the next model step.

It schedules tokens, not phases. Each step, within a token budget, a cap on running requests
and the free KV blocks: running requests' decode tokens first, then their prompt chunks, then
waiting requests in queue order (priority, then arrival; background ones sit out a step with a
more urgent prompt: background.py). A request that cannot get a block preempts the
lowest-ranked running request, which is recomputed later; it is never dropped.

This keeps the queue, the running list and the budget; the parts live beside it: starting
waiting requests (admit.py), taking a step's tokens (step_update.py), how requests end
(endings.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from functools import partial

from headrace.config import SchedulerConfig
from headrace.engine.kv.block_manager import BlockManager
from headrace.engine.kv.kv_manager import KVManager
from headrace.engine.limits import check_fits
from headrace.engine.messages import RequestOutput, StepStats
from headrace.engine.outputs import RunnerOutput, SchedulerOutput
from headrace.engine.sched import background as bg
from headrace.engine.sched.admission import make_admission
from headrace.engine.sched.admit import Admitter
from headrace.engine.sched.endings import Endings
from headrace.engine.sched.fair_queue import FairQueue
from headrace.engine.sched.overlappable import overlappable
from headrace.engine.sched.running import RunningSet
from headrace.engine.sched.speculator import Speculator
from headrace.engine.sched.step_budget import StepBudget
from headrace.engine.sched.step_plan import scheduled_request
from headrace.engine.sched.step_stats import collect_stats
from headrace.engine.sched.step_update import StepUpdate
from headrace.engine.sched.waiting_queue import WaitingQueue
from headrace.request import PENDING_TOKEN, Request, RequestStatus


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
        self._last_prefill = 0  # prompt tokens in the last scheduled step
        self.spec = Speculator(config, max_model_len)
        self.yields = bg.BackgroundYield(config.background_priority)  # background sits out
        self.endings = Endings(self.requests, self.run, self.queue, block_manager, self.admission)
        self.admitter = Admitter(config, self.kv, self.queue, self.run, self.admission)
        self.updater = StepUpdate(self.kv, self.spec, self.endings, max_model_len, clock)
        self.in_flight = False  # a launched step's tokens are assumed, not read (`assume`)

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
        self.endings.end(req, RequestStatus.FINISHED_ABORTED)
        return True

    def emit(self, output: RequestOutput) -> None:
        """Report `output` with the next step (e.g. for a request refused at the door)."""
        self.endings.pending.append(output)

    def fail(self, request_ids: Iterable[str], error: str) -> None:
        """End these requests with `error` (unknown or finished ids are skipped)."""
        self.endings.fail(request_ids, error)

    def take_outputs(self) -> list[RequestOutput]:
        """The outputs that finished outside a step, now (after a step that broke down)."""
        return self.endings.take_outputs()

    def has_work(self) -> bool:
        return bool(self.requests) or bool(self.endings.pending)

    @property
    def num_waiting(self) -> int:
        return len(self.queue)

    def schedule(self) -> SchedulerOutput:
        now = self.clock()
        self.endings.expire(now)
        plan: dict[str, int] = {}  # request id -> tokens this step, in scheduling order
        budget = self.budget.next(self.running, self.queue)
        preempted: set[str] = set()
        speculates = self.spec.begin_step(len(self.running)) and not self.in_flight
        draft = self._draft if speculates else None  # drafts need the tokens before them
        yields = self.yields.sits_out(self.running, self.queue)
        sits_out = self._or_ends_in_flight(yields or bg.nobody)
        for _ in range(2):  # the second pass only if the urgent prompt could not start
            budget = self.run.plan(budget, plan, preempted, draft, sits_out)
            budget = self.admitter.admit(budget, plan, preempted, now, sits_out)
            planned = (self.requests[rid] for rid in plan)
            if yields is None or not self.yields.given_back(planned, self.running):
                break
            sits_out = self._or_ends_in_flight(bg.nobody)
        return self._build_output(plan, now)

    def assume(self, out: SchedulerOutput) -> None:
        """Step `out` is launched and its tokens are not read yet (--async-scheduling): its
        requests move on as if each had its token (a placeholder, PENDING_TOKEN), so that the
        next step is scheduled while it runs. `update(out, ...)` puts the real tokens in."""
        for s in out.scheduled:
            req = self.requests.get(s.request_id)
            if req is None or req.status is not RequestStatus.RUNNING:
                continue  # ended since (its row's token is dropped when the step lands)
            req.num_computed_tokens = s.start_pos + len(s.token_ids)
            if s.sample:
                req.output_token_ids.append(PENDING_TOKEN)
                req.pending = True
        self.in_flight = True

    def may_overlap(self, out: SchedulerOutput) -> bool:
        """Whether the step after `out` may be scheduled before `out`'s tokens are read: its
        rows need no host (`overlappable`), and the next step would carry no drafts (few
        running requests speculate, and drafts are found in the tokens before them)."""
        return not self.spec.speculates(len(self.running)) and overlappable(out)

    def _or_ends_in_flight(self, sits_out: Callable[[Request], bool]) -> Callable[[Request], bool]:
        """`sits_out`, and, with a step in flight, a request whose token there is surely its
        last (its length limit): a row for it in the next step would be wasted."""
        if not self.in_flight:
            return sits_out
        limit = self.max_model_len

        def sits(req: Request) -> bool:
            if sits_out(req):
                return True
            full = req.num_output_tokens >= req.params.max_tokens or req.num_tokens >= limit
            return req.pending and full

        return sits

    def _draft(self, req: Request, budget: int) -> int:
        return self.spec.draft(req, budget, partial(self.blocks.can_fit, req.request_id))

    def update(self, out: SchedulerOutput, result: RunnerOutput) -> list[RequestOutput]:
        """Take the step's tokens: stop checks, KV bookkeeping, the outputs (step_update.py)."""
        self.num_tokens_total += out.num_batched_tokens
        self.in_flight = False  # its placeholders go now (a next one in flight: `assume` again)
        self.updater.apply(out, result)
        return self.take_outputs()

    def _build_output(self, plan: dict[str, int], now: float) -> SchedulerOutput:
        scheduled = []
        prefill = 0  # prompt tokens in the step (the rest: generated ones, or drafts)
        requests, blocks = self.requests, self.blocks
        for rid, n in plan.items():  # every running request, every step: inline
            req = requests[rid]
            drafts = self.spec.take(rid, n) if n > 1 else []
            left = len(req.prompt_token_ids) - req.num_computed_tokens
            if left > 0:
                prefill += min(n, left)
            table, epoch = blocks.block_table(rid), blocks.table_epoch(rid)
            scheduled.append(scheduled_request(req, n - len(drafts), drafts, table, epoch))
            self.queue.charge(req, n)
        self._last_prefill = prefill
        # An empty step is not run: keep the ids for the next one.
        finished = self.endings.take_finished_ids() if scheduled else []
        return SchedulerOutput(scheduled=scheduled, finished_ids=finished)

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
