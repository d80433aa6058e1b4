"""The moment a request arrived, stamped before anything else reads it.

Deadlines (the request's timeout, its queue deadline) count from here, so the time spent
reading and parsing the body, authenticating, tokenizing and crossing into the engine core
counts against them instead of being free.
"""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Receive, Scope, Send

_KEY = "headrace.arrival"


class ArrivalClock:
    """ASGI middleware, outermost: `scope["headrace.arrival"] = time.monotonic()`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope[_KEY] = time.monotonic()
        await self.app(scope, receive, send)


def arrival_time(scope: Scope) -> float:
    """When the request arrived (now, for a scope the middleware did not see)."""
    value = scope.get(_KEY)
    return value if isinstance(value, float) else time.monotonic()
