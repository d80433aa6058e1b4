"""The front end's side of LoRA commands: each `LoraCommand` sent to the core waits for the
`LoraDone` of the same id (or the core's death)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

from headrace.engine.messages import LoraCommand, LoraDone, ToCore


class LoraCommands:
    def __init__(self, send: Callable[[ToCore], None]) -> None:
        self._send = send
        self._ids = itertools.count()
        self._waits: dict[str, asyncio.Future[str | None]] = {}  # command id -> its answer

    async def run(self, name: str, path: str | None) -> None:
        """Load `path` as `name` (unload with `path` None); ValueError with the core's reason."""
        command_id = f"lora#{next(self._ids)}"
        answer: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self._waits[command_id] = answer
        try:
            self._send(LoraCommand(command_id, name, path))
            error = await answer
        finally:
            self._waits.pop(command_id, None)
        if error is not None:
            raise ValueError(error)

    def answer(self, done: LoraDone) -> None:
        waiting = self._waits.get(done.command_id)
        if waiting is not None and not waiting.done():
            waiting.set_result(done.error)

    def fail_all(self, reason: str) -> None:
        for waiting in self._waits.values():
            if not waiting.done():
                waiting.set_exception(RuntimeError(reason))
