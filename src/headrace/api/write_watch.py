"""A deadline on a response's progress: a client that reads none of what it is sent for a while
is dropped, so that it cannot hold its connection (and a stream's engine request and gateway
slot) by not reading.

A transport tells its protocol when its write buffer passes the high-water mark
(`pause_writing`) and when it drains below the low one (`resume_writing`); while paused,
uvicorn holds the route's next `send`. `WriteWatch` is armed while writing is paused and
checks every `timeout_s` whether the buffer shrank: a slow reader that takes something each
time is left alone, one that took nothing is expired.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Callable


class WriteWatch:
    """Calls `expire` once the transport's paused write buffer has not shrunk for `timeout_s`."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        transport: asyncio.WriteTransport,
        timeout_s: float,
        expire: Callable[[], None],
    ) -> None:
        self._loop = loop
        self._transport = transport
        self.timeout_s = timeout_s
        self._expire = expire
        self._timer: asyncio.TimerHandle | None = None
        self._buffered = 0  # bytes waiting when the current period began

    def paused(self) -> None:
        if self._timer is None:
            self._arm()

    def resumed(self) -> None:
        self.stop()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self) -> None:
        self._buffered = self._transport.get_write_buffer_size()
        self._timer = self._loop.call_later(self.timeout_s, self._check)

    def _check(self) -> None:
        self._timer = None
        if self._transport.get_write_buffer_size() < self._buffered:
            self._arm()  # it read something: another period
        else:
            self._expire()


def drop(transport: asyncio.Transport) -> None:
    """Close at once, discarding what the client did not read: an RST rather than a FIN, so
    that the kernel does not go on holding the unsent bytes for a client that reads nothing."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()
