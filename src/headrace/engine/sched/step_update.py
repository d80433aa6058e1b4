"""After a step: each scheduled request takes its sampled token and accepted drafts, is checked
for a stop, and records what its KV entries now hold; one output per sampling request.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from headrace.engine.kv.kv_manager import KVManager
from headrace.engine.outputs import RunnerOutput, ScheduledRequest, SchedulerOutput
from headrace.engine.sched import request_report as report
from headrace.engine.sched.endings import Endings
from headrace.engine.sched.speculation import accept
from headrace.engine.sched.speculator import Speculator
from headrace.engine.sched.stop_checker import append_until_stop, check_stop
from headrace.request import Request, RequestStatus

# The scheduler's logger, as before this moved here: filters and readers of the log still match.
log = logging.getLogger("headrace.engine.sched.scheduler")


class StepUpdate:
    def __init__(
        self,
        kv: KVManager,
        spec: Speculator,
        endings: Endings,
        max_model_len: int,
        clock: Callable[[], float],
    ) -> None:
        self.kv = kv
        self.spec = spec
        self.endings = endings
        self.max_model_len = max_model_len
        self.clock = clock

    def apply(self, out: SchedulerOutput, result: RunnerOutput) -> None:
        """Update every request of `out` that still runs; their outputs go to `endings.pending`."""
        for s in out.scheduled:
            req = self.endings.requests.get(s.request_id)
            if req is None or req.status is not RequestStatus.RUNNING:
                continue
            try:
                self._update_one(req, s, result)
            except Exception as e:  # one request's bad output must not end the others
                log.exception("updating request %s failed", s.request_id)
                self.endings.fail([s.request_id], f"engine error: {type(e).__name__}: {e}")

    def _update_one(self, req: Request, s: ScheduledRequest, result: RunnerOutput) -> None:
        req.drop_pending()  # the placeholder of this step's token (--async-scheduling)
        token = result.sampled.get(s.request_id) if s.sample else None
        if token is not None and not s.draft_token_ids:  # most rows of most steps: inline
            req.output_token_ids.append(token)
            status, emitted = check_stop(req, token, self.max_model_len), [token]
            req.num_computed_tokens = s.start_pos + len(s.token_ids)
            self.kv.computed(req, drafted=False)
        else:
            status, emitted = self._take(req, s, token, result)
            if not s.sample:
                return
            if token is None:
                self.endings.end(req, *report.ended_without_token(req.request_id, result))
                return
        if req.first_token_time is None:
            req.first_token_time = self.clock()
        if status is not None:
            self.endings.finish(req, status)
        lp = result.logprobs.get(s.request_id)
        output = report.request_output(req, emitted, logprobs=[lp] if lp else [])
        self.endings.pending.append(output)

    def _take(
        self, req: Request, s: ScheduledRequest, token: int | None, result: RunnerOutput
    ) -> tuple[RequestStatus | None, list[int]]:
        """A row with drafts, or without a token (a prompt chunk, or no pick): the tokens it
        keeps up to a stop, its computed tokens and drafts settled."""
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
        return status, emitted
