"""Refuse at the door: a request the gateway would refuse anyway is answered from its headers.

Under a burst, every request costs the front end routing, body parsing and validation before
the route's first gateway check; with hundreds waiting on one event loop, the last refusal
arrived hundreds of milliseconds late. The checks that need no body — the API key (401), the
tenant's limits and the queue bound (429 / 503 with Retry-After) — run here first, before the
application sees the request. A request that passes is handled as before (the route runs the
same checks again, with the prompt's size).

Only for the generation routes, and only when the server serves one model (the body names the
model otherwise).
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from headrace.api.errors import APIError, send_error
from headrace.api.state import AppState
from headrace.gateway.errors import GatewayError

GENERATION_ROUTES = frozenset({"/v1/generate", "/v1/completions", "/v1/chat/completions"})


class EarlyRefusal:
    """ASGI middleware in front of the whole app (`headrace.api.app.front_door`)."""

    def __init__(self, app: ASGIApp, state: AppState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        refusal = self._refusal(scope) if scope["type"] == "http" else None
        if refusal is None:
            await self.app(scope, receive, send)
            return
        await send_error(send, refusal)

    def _refusal(self, scope: Scope) -> APIError | None:
        if scope["method"] != "POST" or scope["path"] not in GENERATION_ROUTES:
            return None
        state = self.state
        if len(state.engines) != 1 or state.loading or state.shutdown.is_set():
            return None  # the route says which model, or why none serves
        try:
            tenant = state.gateway.authenticate(Headers(scope=scope))
            state.gateway.check(tenant, next(iter(state.engines)))
        except GatewayError as e:
            return APIError.from_gateway(e)
        return None
