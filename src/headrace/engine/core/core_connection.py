"""How a front end reaches its engine core: `core_proc.ProcessCore` or `core_thread.ThreadCore`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from headrace.engine.core.core_loop import CoreSpec
from headrace.engine.messages import FromCore, ToCore


class CoreConnection(Protocol):
    """`start` launches the core; every message it sends, `CoreReady` (or `CoreFailed`) first,
    arrives through `on_message` on the event loop; `on_death` is called once if the core goes
    away without being closed. `send` never blocks and never drops a message: one the core
    cannot take yet waits, in order; only a new request may be refused at once
    (`core_link.CoreBusyError`) when too many wait.
    """

    spec: CoreSpec

    @property
    def is_alive(self) -> bool: ...

    @property
    def pid(self) -> int | None:
        """The core's process (None for a thread)."""
        ...

    def start(
        self, on_message: Callable[[FromCore], None], on_death: Callable[[str], None]
    ) -> None: ...

    def send(self, msg: ToCore) -> None: ...

    async def close(self) -> None: ...
