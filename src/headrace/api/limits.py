"""A request body over the size limit is refused with 413 before it is read in full."""

from __future__ import annotations

import json

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from headrace.api.errors import error_body


class BodyTooLarge(HTTPException):
    """Raised from `receive` mid-body; FastAPI lets HTTPExceptions through its body parsing."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body is larger than the limit of {limit} bytes")


class BodySizeLimit:
    """ASGI middleware: checks Content-Length up front, and counts chunked bodies as they come."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and not length.isdigit():
            await _refuse(send, 400, "Content-Length is not a number")
            return
        if length is not None and int(length) > self.max_bytes:
            await _refuse(send, 413, BodyTooLarge(self.max_bytes).detail)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, counted, send)


async def _refuse(send: Send, status: int, message: str) -> None:
    data = error_body(message, "invalid_request_error", None, status)
    body = json.dumps(data, separators=(",", ":")).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers.append((b"connection", b"close"))  # the unread body must not be parsed as a request
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
