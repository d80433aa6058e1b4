"""How requests end: finished by a step's token, or ended outside one (abort, deadline, error).

Either way the request leaves the running list or the queue, frees its blocks and leaves
`requests`; its id waits in `finished_ids` for the runner to drop its state. The outputs of
requests ended outside a step wait in `pending` and go with the next step.
"""

from __future__ import annotations

from collections.abc import Iterable

from headrace.engine.kv.block_manager import BlockManager
from headrace.engine.messages import RequestOutput
from headrace.engine.sched import request_report as report
from headrace.engine.sched.admission import ContinuousAdmission, StaticAdmission
from headrace.engine.sched.running import RunningSet
from headrace.engine.sched.waiting_queue import WaitingQueue
from headrace.request import Request, RequestStatus


class Endings:
    def __init__(
        self,
        requests: dict[str, Request],
        run: RunningSet,
        queue: WaitingQueue,
        blocks: BlockManager,
        admission: ContinuousAdmission | StaticAdmission,
    ) -> None:
        self.requests = requests  # the scheduler's own dict: every unfinished request
        self.run = run
        self.queue = queue
        self.blocks = blocks
        self.admission = admission
        self.pending: list[RequestOutput] = []  # finished outside a step (abort, deadline)
        self.finished_ids: list[str] = []  # for the runner to drop their state

    def finish(self, req: Request, status: RequestStatus) -> None:
        if req in self.run.requests:
            self.run.requests.remove(req)
        else:
            self.queue.remove(req)
        self.blocks.free(req.request_id)
        req.drop_pending()  # ended before its launched step landed: that token is not its own
        req.status = status
        del self.requests[req.request_id]
        self.finished_ids.append(req.request_id)
        self.admission.on_finish(req)

    def end(self, req: Request, status: RequestStatus, error: str | None = None) -> None:
        """Finish `req` outside a step's tokens; its last output goes with the next step."""
        self.finish(req, status)
        self.pending.append(report.request_output(req, [], error=error))

    def fail(self, request_ids: Iterable[str], error: str) -> None:
        """End these requests with `error` (unknown or finished ids are skipped)."""
        for rid in list(request_ids):
            req = self.requests.get(rid)
            if req is not None:
                self.end(req, RequestStatus.FINISHED_ERROR, error)

    def expire(self, now: float) -> None:
        for req in list(self.requests.values()):
            status = report.expired_status(req, now)
            if status is not None:
                self.end(req, status)

    def take_outputs(self) -> list[RequestOutput]:
        outputs, self.pending = self.pending, []
        return outputs

    def take_finished_ids(self) -> list[str]:
        ids, self.finished_ids = self.finished_ids, []
        return ids
