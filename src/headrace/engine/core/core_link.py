"""The limits of the ZeroMQ link between a front end and its core process, and what happens
when they are reached: nothing is dropped.

Front end -> core (requests, aborts): a message that does not fit in the socket waits in the
front end's own queue, in order, and is sent as soon as the core reads again (back-pressure).
Only a new request is refused, and at once, when `pending_limit` messages already wait: an
abort or a shutdown is always queued (they free the core's work).

Core -> front end (outputs): the front end reads continuously and outputs are small, so the
core's send waits, but at most `out_timeout_s`: a front end that reads nothing for that long
is stuck, and the core stops (exit code `FRONT_END_STUCK_EXIT`) rather than block its step
loop for ever; the front end, if it ever wakes, sees the core's death and fails its requests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import zmq

FRONT_END_STUCK_EXIT = 3


class CoreBusyError(RuntimeError):
    """The core's inbox is full and `pending_limit` messages already wait to be sent."""


class FrontEndStuckError(RuntimeError):
    """The front end took no output for `out_timeout_s`."""


@dataclass(frozen=True)
class CoreLink:
    """Picklable: the core process applies its half."""

    hwm: int = 1000  # messages ZeroMQ queues per socket (SNDHWM / RCVHWM; its default)
    buffer_bytes: int = -1  # the kernel's socket buffers (-1: the OS default); tests shrink it
    pending_limit: int = 4096  # messages the front end holds while the core reads nothing
    out_timeout_s: float = 60.0  # how long the core waits for a front end that reads nothing

    def __post_init__(self) -> None:
        if self.hwm < 0 or self.pending_limit < 1 or not self.out_timeout_s > 0:
            raise ValueError(f"bad core link limits: {self}")

    def sender(self, sock: zmq.Socket[Any]) -> None:
        sock.setsockopt(zmq.SNDHWM, self.hwm)
        sock.setsockopt(zmq.SNDBUF, self.buffer_bytes)

    def receiver(self, sock: zmq.Socket[Any]) -> None:
        sock.setsockopt(zmq.RCVHWM, self.hwm)
        sock.setsockopt(zmq.RCVBUF, self.buffer_bytes)
