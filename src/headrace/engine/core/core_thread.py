"""An engine core in a thread of this process: the same messages as a core process, unencoded.

For tests and single-process use. The model's kernels release the GIL, so the event loop
stays responsive while a step runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import traceback
from collections.abc import Callable

from headrace.engine.core.core_loop import CoreSpec, run_core_loop
from headrace.engine.messages import CoreFailed, FromCore, Shutdown, ToCore

log = logging.getLogger(__name__)


class ThreadCore:
    def __init__(self, spec: CoreSpec, served_model_name: str | None = None) -> None:
        self.spec = spec
        self.served_model_name = served_model_name
        self._inbox: queue.Queue[ToCore] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._closing = False

    @property
    def pid(self) -> int | None:
        return None  # this process's: not one to kill

    @property
    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(
        self, on_message: Callable[[FromCore], None], on_death: Callable[[str], None]
    ) -> None:
        loop = asyncio.get_running_loop()

        def post(msg: FromCore) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody listens
                loop.call_soon_threadsafe(on_message, msg)

        def died(reason: str) -> None:
            if not self._closing:
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(on_death, reason)

        self._thread = threading.Thread(
            target=self._run, args=(post, died), name="headrace-engine-core", daemon=True
        )
        self._thread.start()

    def send(self, msg: ToCore) -> None:
        if not self._closing:
            self._inbox.put(msg)

    async def close(self) -> None:
        if self._closing:
            return
        self._inbox.put(Shutdown())
        self._closing = True
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)

    def _run(self, post: Callable[[FromCore], None], died: Callable[[str], None]) -> None:
        try:
            core = self.spec.build()
        except BaseException:
            post(CoreFailed(traceback.format_exc()))
            return
        post(core.ready_message(self.served_model_name))
        try:
            run_core_loop(core, self._recv, post)
        except BaseException as e:
            log.exception("engine core thread crashed")
            died(f"the engine core crashed: {type(e).__name__}: {e}")
            return
        died("the engine core stopped")

    def _recv(self, timeout: float) -> list[ToCore]:
        msgs: list[ToCore] = []
        try:
            msgs.append(
                self._inbox.get(timeout=timeout) if timeout > 0 else self._inbox.get_nowait()
            )
            while True:
                msgs.append(self._inbox.get_nowait())
        except queue.Empty:
            pass
        return msgs
