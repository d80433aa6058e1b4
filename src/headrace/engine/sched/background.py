"""Background work yields the steps that carry a more urgent prompt.

Requests at `--background-priority` or less urgent (the batch tier's priority by default: the
Batch API's lines) fill the capacity interactive traffic leaves over. The queue already admits
them last; this keeps them out of the one step where their rows cost an interactive request
most: the step that computes its prompt, whose length is that request's time to first token.
So while a more urgent request has prompt tokens left (running, or first in the queue), the
step leaves every background request out (running ones keep their KV blocks and go on at the
next step); all other steps carry them as before. With interactive requests arriving one per
few steps, background work loses only those steps, and never starves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from headrace.engine.sched.waiting_queue import WaitingQueue
from headrace.request import Request

SitsOut = Callable[[Request], bool]  # whether a request gets no tokens this step


def is_background(req: Request, threshold: int) -> bool:
    return req.priority >= threshold


def urgent_prompt(requests: Iterable[Request], threshold: int) -> bool:
    """Whether any of `requests` is more urgent than background and has prompt tokens left."""
    return any(
        not is_background(r, threshold) and r.num_computed_tokens < r.num_prompt_tokens
        for r in requests
    )


def background_yields(running: Iterable[Request], queue: WaitingQueue, threshold: int) -> bool:
    """Whether this step leaves background requests out: a more urgent request has prompt
    tokens to compute (running, or the next to be admitted). If the waiting one cannot start
    after all, the scheduler plans the background requests in the same step."""
    first = queue.peek()
    return (first is not None and not is_background(first, threshold)) or urgent_prompt(
        running, threshold
    )
