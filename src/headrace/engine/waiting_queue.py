"""The order in which waiting requests are admitted.

Two implementations: priority-then-arrival (`PriorityQueue`, the default) and per-tenant fair
sharing within a priority (`headrace.engine.fair_queue.FairQueue`, used by the gateway).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from headrace.request import Request


class WaitingQueue(Protocol):
    """Contract: `peek` names the request to admit next without removing it; `pop` removes
    exactly that request. A preempted request re-enters with `add` and keeps its arrival time,
    so it goes back ahead of later arrivals of its class. `charge` tells the queue how many
    tokens a request was served in a step (prefill or decode), for fair-share accounting."""

    def add(self, req: Request) -> None: ...

    def peek(self) -> Request | None: ...

    def pop(self) -> Request: ...

    def remove(self, req: Request) -> None: ...

    def charge(self, req: Request, num_tokens: int) -> None: ...

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Request]: ...
