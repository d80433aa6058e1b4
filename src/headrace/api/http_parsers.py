"""The front door's limits (http_protocol.py) over each of uvicorn's HTTP/1.1 parsers:
`HttpToolsFrontDoor` (httptools, uvicorn's C parser: the default, about half the CPU per
request) and `H11FrontDoor` (h11, pure Python). Each supplies the parser's view of the request
being read and how an error is written. `uvicorn_options(limits, parser)` is what
`uvicorn.Config` takes.
"""

from __future__ import annotations

from typing import Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import STATUS_PHRASES, H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from headrace.api.http_protocol import (
    FrontDoor,
    FrontDoorLimits,
    Reading,
    Tally,
    Uncounted,
    answer_bytes,
)
from headrace.api.limits import header_too_large

PARSERS = ("httptools", "h11")


def uvicorn_options(
    limits: FrontDoorLimits, parser: str = "httptools", send_timeouts: Tally | None = None
) -> dict[str, Any]:
    """The `uvicorn.Config` arguments that put these limits in place, parsing with `parser`;
    `send_timeouts` counts the connections dropped for not reading."""
    counter = send_timeouts or Uncounted()
    if parser == "h11":

        class H11(H11FrontDoor):
            front_door = limits
            send_timeouts = counter

        # h11 refuses a header still incomplete past this size; a whole one is HeaderSizeLimit's
        return {"http": H11, "h11_max_incomplete_event_size": limits.max_header_bytes}
    if parser != "httptools":
        raise ValueError(f"unknown HTTP parser {parser!r}: one of {', '.join(PARSERS)}")

    class HttpTools(HttpToolsFrontDoor):
        front_door = limits
        send_timeouts = counter

    return {"http": HttpTools}


class HttpToolsFrontDoor(FrontDoor, HttpToolsProtocol):
    """The limits over httptools (llhttp). llhttp has no header size limit: the bytes of a head
    still incomplete are counted here, and one past the limit is a 431 (a whole one that
    arrives in a read is HeaderSizeLimit's, as for h11)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._state = Reading.HEAD
        self._head_begun = False  # a request's first byte is parsed, its head not complete
        self._head_count = 0  # bytes read while a head was incomplete

    def data_received(self, data: bytes) -> None:
        if self.lingering:
            return
        if self._state is Reading.HEAD:
            self._head_count += len(data)
        super().data_received(data)
        if self._state is Reading.HEAD and self._head_bytes() > self.front_door.max_header_bytes:
            self._state = Reading.ERROR  # its head is not parsed further
            self._send_error(431, header_too_large(self.front_door.max_header_bytes))

    def send_400_response(self, msg: str) -> None:
        self._state = Reading.ERROR
        super().send_400_response(msg)

    def on_message_begin(self) -> None:
        self._state, self._head_begun = Reading.HEAD, True
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._state, self._head_begun, self._head_count = Reading.BODY, False, 0
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._state = Reading.DONE
        super().on_message_complete()

    def on_response_complete(self) -> None:
        if self._state is Reading.DONE:
            self._state = Reading.HEAD  # ready for the next request on this connection
        super().on_response_complete()

    def _reading(self) -> Reading:
        return self._state

    def _head_bytes(self) -> int:
        if self._state is not Reading.HEAD and self._state is not Reading.ERROR:
            return 0
        return max(self._head_count, 1) if self._head_begun else self._head_count

    def _answer_begun(self) -> bool:
        if self.cycle is None:
            return False
        if self._head_begun or self._state is Reading.HEAD:  # the cycle is the last request's
            return not self.cycle.response_complete  # whose answer must not be interleaved
        return bool(self.cycle.response_started)

    def _write_answer(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self.transport.write(answer_bytes(status, headers, body))


class H11FrontDoor(FrontDoor, H11Protocol):
    """The limits over h11, whose buffer limit refuses a head still incomplete past the size."""

    _STATES: ClassVar[dict[Any, Reading]] = {
        h11.IDLE: Reading.HEAD, h11.SEND_BODY: Reading.BODY, h11.ERROR: Reading.ERROR,
    }  # fmt: skip

    def _reading(self) -> Reading:
        return self._STATES.get(self.conn.their_state, Reading.DONE)

    def _head_bytes(self) -> int:
        return len(self.conn.trailing_data[0])

    def _answer_begun(self) -> bool:
        return self.conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE)

    def _write_answer(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        response = h11.Response(status_code=status, headers=headers, reason=STATUS_PHRASES[status])
        for event in (response, h11.Data(data=body), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event) or b"")
