"""uvicorn's HTTP/1.1 protocols with the limits of a server facing the open network: a deadline
for a request's line and headers and another for its body (a client that sends half a request
and stops is dropped, not held forever), one for a response's progress (a client that stops
reading is dropped: `write_watch.py`), a header size limit answered with 431, and a cap on open
connections: one past it is answered 503 with Retry-After as soon as it is accepted, so an idle
one holds no descriptor for long. Errors are JSON in OpenAI's shape, and a connection closed on
an error while the client is still sending lingers (half-closed, its input drained) for a
moment, so the client reads the answer instead of a reset.

The limits live in `FrontDoor`, written once against a parser-neutral view of the request
being read (`Reading`); each parser (http_parsers.py) supplies only that view and how an error
is written. Parsing stays the library's; this adds a timer per connection and swaps the ASGI
app a connection sees.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import resource
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, cast

from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from headrace.api.limits import HeaderSizeLimit, error_response, header_too_large
from headrace.api.write_watch import WriteWatch, drop
from headrace.config import ServerConfig

log = logging.getLogger("headrace.api")

RETRY_AFTER_S = 1  # connections free up quickly: keep-alive and request deadlines bound them
LINGER_S = 1.0  # Go's server waits 0.5 s after its FIN; draining meanwhile, we may end sooner
_FDS_BESIDE_CONNECTIONS = 256  # engine pipes, model files, logs


@dataclass(frozen=True)
class FrontDoorLimits:
    max_header_bytes: int
    header_timeout_s: float
    body_timeout_s: float
    max_connections: int
    send_timeout_s: float = 30.0

    @classmethod
    def from_config(cls, config: ServerConfig) -> FrontDoorLimits:
        return cls(
            config.max_header_bytes, config.header_timeout_s, config.body_timeout_s,
            config.max_connections, config.send_timeout_s,
        )  # fmt: skip


class Tally(Protocol):
    """Where an event is counted (a prometheus-client Counter)."""

    def inc(self) -> None: ...


class Uncounted:
    def inc(self) -> None:
        pass


class Reading(enum.Enum):
    """Where the client's current request stands, as its parser sees it."""

    HEAD = "head"  # between requests, or their line and headers under way
    BODY = "body"  # the head is in, its body is arriving
    DONE = "done"  # all of it is in (its answer may be pending)
    ERROR = "error"  # the bytes are not HTTP: nothing more is parsed


class FrontDoor(asyncio.Protocol):
    """The limits, mixed in ahead of a uvicorn protocol class (which provides `app`, `loop`,
    `transport`, `connections` and `cycle`, and is what `super()` reaches)."""

    front_door: ClassVar[FrontDoorLimits]
    last_refusal_log: ClassVar[float] = float("-inf")  # loop time of its last log line
    send_timeouts: ClassVar[Tally] = Uncounted()
    app: Any
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    connections: set[Any]
    cycle: Any
    _writes: WriteWatch  # the send timeout

    # what the parser says
    def _reading(self) -> Reading:
        raise NotImplementedError

    def _head_bytes(self) -> int:
        """Bytes of a request head received and not yet parsed into a request."""
        raise NotImplementedError

    def _answer_begun(self) -> bool:
        raise NotImplementedError

    def _write_answer(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        raise NotImplementedError

    # the limits
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.app = HeaderSizeLimit(self.app, self.front_door.max_header_bytes)
        self.refused = False
        self._timer: asyncio.TimerHandle | None = None
        self._phase: str | None = None  # "headers" or "body": what the timer waits for
        self.lingering = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.raw_transport = cast(asyncio.Transport, transport)
        super().connection_made(cast(asyncio.Transport, _LingeringClose(self.raw_transport, self)))
        timeout = self.front_door.send_timeout_s
        self._writes = WriteWatch(self.loop, self.raw_transport, timeout, self._send_timed_out)
        if self._admitted() > self.front_door.max_connections:
            self._refuse()
        else:
            self._start("headers")

    def pause_writing(self) -> None:
        super().pause_writing()
        self._writes.paused()

    def resume_writing(self) -> None:
        super().resume_writing()
        self._writes.resumed()

    def data_received(self, data: bytes) -> None:
        if self.lingering:
            return  # the rest of a request already answered
        if self._timer is None and self._reading() is Reading.HEAD:
            self._start("headers")  # the next request on a kept-alive connection begins
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        self._follow()  # a pipelined request may be halfway through its body

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop()
        self._writes.stop()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        """The parser refused the bytes: a header past the size limit is a 431, the rest a 400."""
        limit = self.front_door.max_header_bytes
        if self._head_bytes() > limit:
            self._send_error(431, header_too_large(limit))
        else:
            self._send_error(400, "invalid HTTP request")

    def close(self) -> None:
        """Close now, or linger if the client may still be sending what we did not read."""
        raw = self.raw_transport
        if self.lingering or raw.is_closing():
            return
        reading = self._reading()
        unread = reading in (Reading.BODY, Reading.ERROR) or self._head_bytes() > 0
        if not unread or not raw.can_write_eof():
            raw.close()
            return
        self._linger()

    def _linger(self) -> None:
        raw = self.raw_transport
        self.lingering = True
        raw.write_eof()  # FIN after the answer; its EOF back (eof_received) closes us early
        raw.resume_reading()
        self._stop()
        self._timer = self.loop.call_later(LINGER_S, raw.close)

    def _refuse(self) -> None:
        """Past the connection cap: answer at once, before any request, and close; waiting for
        its request would let idle connections past the cap hold descriptors."""
        cap = self.front_door.max_connections
        now = self.loop.time()
        if now - self.last_refusal_log >= 1.0:  # a flood of connections is not a flood of lines
            type(self).last_refusal_log = now
            log.warning("refusing connections: %d open, the limit is %d", self._admitted(), cap)
        self.refused = True
        message = f"the server has too many open connections (limit {cap}); retry later"
        retry = [(b"retry-after", str(RETRY_AFTER_S).encode())]
        headers, body = error_response(503, message, "overloaded_error", retry)
        self.raw_transport.write(answer_bytes(503, headers, body))
        self._linger()  # the client may be sending its request: it reads the 503, not a reset

    def _send_timed_out(self) -> None:
        """The client read none of its response for the send timeout: drop the connection. The
        route's pending `send` returns and its `receive` says the client is gone, so a stream
        stops and aborts its engine request."""
        log.info("dropping a connection: its client read nothing for %g s", self._writes.timeout_s)
        self.send_timeouts.inc()
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True
            self.cycle.message_event.set()  # before the send resumes: the stream sees it first
        self._stop()
        drop(self.raw_transport)

    def _admitted(self) -> int:
        return sum(1 for c in self.connections if isinstance(c, FrontDoor) and not c.refused)

    def _follow(self) -> None:
        """Keep the timer in step with the parser's view of the client's request."""
        if self.lingering:
            return  # the linger timer ends this connection
        reading = self._reading()
        if reading is Reading.BODY and self._phase != "body":
            self._start("body")
        elif reading not in (Reading.HEAD, Reading.BODY):
            self._stop()

    def _start(self, phase: str) -> None:
        self._stop()
        limits = self.front_door
        timeout = limits.header_timeout_s if phase == "headers" else limits.body_timeout_s
        self._phase = phase
        self._timer = self.loop.call_later(timeout, self._expire)

    def _stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._phase = None, None

    def _expire(self) -> None:
        phase = self._phase
        self._timer, self._phase = None, None
        if self.transport.is_closing():
            return
        if phase == "headers" and not self._head_bytes():
            self.transport.close()  # it never asked anything: nothing to answer
            return
        limits = self.front_door
        timeout = limits.header_timeout_s if phase == "headers" else limits.body_timeout_s
        what = "request line and headers" if phase == "headers" else "request body"
        log.debug("dropping a connection: its %s took longer than %g s", what, timeout)
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True  # the route waiting for the body gives up now
            self.cycle.message_event.set()
        self._send_error(408, f"the {what} did not arrive within {timeout:g} s", linger=False)

    def _send_error(self, status: int, message: str, *, linger: bool = True) -> None:
        """Answer with a JSON error if no response has begun, then close."""
        if not self._answer_begun():
            headers, body = error_response(status, message)
            self._write_answer(status, headers, body)
        if linger:
            self.close()
        else:
            self.raw_transport.close()


def answer_bytes(status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bytes:
    head = b"".join(name + b": " + value + b"\r\n" for name, value in headers)
    return STATUS_LINE[status] + head + b"\r\n" + body


class _LingeringClose:
    """The connection's transport for uvicorn's code, whose `close()` asks the protocol."""

    def __init__(self, transport: asyncio.Transport, protocol: FrontDoor) -> None:
        self._transport = transport
        self._protocol = protocol

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def close(self) -> None:
        self._protocol.close()

    def is_closing(self) -> bool:
        return self._protocol.lingering or self._transport.is_closing()


def fit_fd_limit(max_connections: int) -> None:
    """Each connection holds a file descriptor: raise the soft limit toward the hard one, so
    that the connection cap refuses with a 503 before accept() fails with EMFILE."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max_connections + _FDS_BESIDE_CONNECTIONS
    if soft == resource.RLIM_INFINITY or soft >= want:
        return
    new = want if hard == resource.RLIM_INFINITY else min(want, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    if new < want:
        log.warning(
            "open files are limited to %d: fewer than --max-connections %d needs",
            new,
            max_connections,
        )
