"""What the scheduler says of a request: the deadline it has passed, how it ends without a
token, and its output message."""

from __future__ import annotations

from headrace.engine.messages import RequestOutput, TokenLogprobs
from headrace.engine.outputs import RunnerOutput
from headrace.request import Request, RequestStatus


def expired_status(req: Request, now: float) -> RequestStatus | None:
    """How `req` ends at `now` for a deadline: `timeout` past its own, `overloaded` when it
    has not started by its queue deadline (the gateway's load shedding); None otherwise."""
    if req.deadline is not None and now >= req.deadline:
        return RequestStatus.FINISHED_TIMEOUT
    if (
        req.queue_deadline is not None
        and now >= req.queue_deadline
        and req.first_scheduled_time is None
    ):
        return RequestStatus.FINISHED_OVERLOADED
    return None


def ended_without_token(request_id: str, result: RunnerOutput) -> tuple[RequestStatus, str | None]:
    """How a request the runner gave no token ends: its constraint ended it (complete: `stop`),
    or the runner could not sample it (`error`, with the runner's reason)."""
    if request_id in result.stopped:
        return RequestStatus.FINISHED_STOPPED, None
    error = result.errors.get(request_id, "the model runner sampled no token")
    return RequestStatus.FINISHED_ERROR, error


def request_output(
    req: Request,
    new_token_ids: list[int],
    error: str | None = None,
    logprobs: list[TokenLogprobs] | None = None,
) -> RequestOutput:
    """The message for `req`'s tokens of this step (its status as it stands now)."""
    started = req.first_scheduled_time
    return RequestOutput(
        request_id=req.request_id,
        new_token_ids=new_token_ids,
        finish_reason=req.status.finish_reason,
        num_prompt_tokens=req.num_prompt_tokens,
        num_output_tokens=req.num_output_tokens,
        logprobs=logprobs or [],
        error=error,
        queue_time=None if started is None else started - req.arrival_time,
        num_cached_tokens=req.num_cached_tokens,
        num_recomputed_tokens=req.num_recomputed_tokens,
        num_draft_tokens=req.num_draft_tokens,
        num_accepted_tokens=req.num_accepted_tokens,
    )
