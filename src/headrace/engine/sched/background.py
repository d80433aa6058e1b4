"""Background work yields the steps that carry a more urgent prompt.

Requests at `--background-priority` or less urgent (the batch tier's priority by default: the
Batch API's lines) fill the capacity interactive traffic leaves over. The queue already admits
them last; this keeps them out of the one step where their rows cost an interactive request
most: the step that computes its prompt, whose length is that request's time to first token.
So while a more urgent request has prompt tokens left (running, or first in the queue), the
step leaves every background request out (running ones keep their KV blocks and go on at the
next step); all other steps carry them as before. At most MOST_IN_A_ROW steps in a row sit
out, then one carries background work whatever waits: under a stream of urgent prompts it
slows, and never starves (nor holds its blocks and slots indefinitely).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial

from headrace.engine.sched.waiting_queue import WaitingQueue
from headrace.request import Request

SitsOut = Callable[[Request], bool]  # whether a request gets no tokens this step
MOST_IN_A_ROW = 4


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


class BackgroundYield:
    """Which steps background requests sit out: `background_yields`, at most MOST_IN_A_ROW
    in a row."""

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self.in_a_row = 0

    def sits_out(self, running: Iterable[Request], queue: WaitingQueue) -> SitsOut | None:
        """Who sits this step out (background requests), or None: nobody."""
        if self.in_a_row >= MOST_IN_A_ROW or not background_yields(running, queue, self.threshold):
            self.in_a_row = 0
            return None
        self.in_a_row += 1
        return partial(is_background, threshold=self.threshold)

    def given_back(self, planned: Iterable[Request], running: Iterable[Request]) -> bool:
        """Whether the step goes back to background requests after all: its plan computes no
        urgent prompt (the waiting one could not start) and some of them are running (a
        waiting one would not start either: the queue's head is the urgent request)."""
        return not urgent_prompt(planned, self.threshold) and any(
            is_background(r, self.threshold) for r in running
        )


def nobody(req: Request) -> bool:
    return False
