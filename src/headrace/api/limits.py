"""Size limits on a request: a body over the limit is refused with 413 before it is read in
full, a request line plus headers over theirs with 431. Both answer in OpenAI's error shape and
close the connection, whose unread rest must not be parsed as a request."""

from __future__ import annotations

import json
from collections.abc import Iterable

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from headrace.api.errors import error_body

Headers = Iterable[tuple[bytes, bytes]]


class BodyTooLarge(HTTPException):
    """Raised from `receive` mid-body; FastAPI lets HTTPExceptions through its body parsing."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body is larger than the limit of {limit} bytes")


class BodySizeLimit:
    """ASGI middleware: checks Content-Length up front, and counts chunked bodies as they come."""

    def __init__(
        self, app: ASGIApp, max_bytes: int, uploads: tuple[str, int] | None = None
    ) -> None:
        """`uploads`: (path, limit) of the one route that takes larger bodies (/v1/files)."""
        self.app = app
        self.max_bytes = max_bytes
        self.uploads = uploads

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_bytes
        if self.uploads is not None and scope["path"] == self.uploads[0]:
            limit = self.uploads[1]
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and not length.isdigit():
            await refuse(send, 400, "Content-Length is not a number")
            return
        if length is not None and int(length) > limit:
            await refuse(send, 413, BodyTooLarge(limit).detail)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(limit)
            return message

        await self.app(scope, counted, send)


class HeaderSizeLimit:
    """ASGI middleware: 431 for a request line plus headers over `max_bytes`. h11 refuses an
    oversized header only while it is incomplete; one that arrives whole in a read reaches here."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and header_bytes(scope) > self.max_bytes:
            await refuse(send, 431, header_too_large(self.max_bytes))
            return
        await self.app(scope, receive, send)


def header_bytes(scope: Scope) -> int:
    """The request line and headers as they came on the wire, give or take some whitespace."""
    line = len(scope["method"]) + len(scope.get("raw_path", b"")) + len(scope["query_string"])
    return line + len(" ? HTTP/1.1\r\n") + sum(len(k) + len(v) + 4 for k, v in scope["headers"])


def header_too_large(limit: int) -> str:
    return f"request line and headers are larger than the limit of {limit} bytes"


def error_response(
    status: int, message: str, type: str = "invalid_request_error", headers: Headers = ()
) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """Headers and body of a JSON error that closes the connection."""
    data = error_body(message, type, None, status)
    body = json.dumps(data, separators=(",", ":")).encode()
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    head.append((b"connection", b"close"))
    return head + list(headers), body


async def refuse(
    send: Send,
    status: int,
    message: str,
    *,
    type: str = "invalid_request_error",
    headers: Headers = (),
) -> None:
    head, body = error_response(status, message, type, headers)
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})
