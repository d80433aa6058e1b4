"""The uvicorn server `headrace serve` runs: its settings, and the signal handling that lets
streams in flight end with an error event and SIGHUP reload the tenants file."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from types import FrameType

import uvicorn
from fastapi import FastAPI

from headrace.api.app import front_door
from headrace.api.audit import audit_reload
from headrace.api.http_parsers import uvicorn_options
from headrace.api.http_protocol import FrontDoorLimits
from headrace.api.state import AppState
from headrace.config import ServerConfig
from headrace.gateway.reload import ReloadResult

log = logging.getLogger("headrace.serve")


def uvicorn_config(app: FastAPI, server_cfg: ServerConfig, state: AppState) -> uvicorn.Config:
    return uvicorn.Config(
        front_door(app), host=server_cfg.host, port=server_cfg.port, workers=1, lifespan="on",
        log_level=server_cfg.log_level, access_log=server_cfg.log_level == "debug",
        timeout_graceful_shutdown=5, timeout_keep_alive=30, loop="uvloop",
        **uvicorn_options(
            FrontDoorLimits.from_config(server_cfg), server_cfg.http_parser,
            state.metrics.send_timeouts,
        ),
    )  # fmt: skip


class Server(uvicorn.Server):
    """uvicorn's server, telling the app about a stop signal before it drains connections, so
    that streams in flight end with an error event instead of holding the shutdown up; and
    reloading the tenants file on SIGHUP (whose default action would end the process)."""

    def __init__(self, config: uvicorn.Config, state: AppState) -> None:
        super().__init__(config)
        self.app_state = state

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            with super().capture_signals():  # signals reach the main thread only
                yield
            return
        loop = asyncio.get_running_loop()  # uvicorn enters this from its `serve` coroutine
        loop.add_signal_handler(signal.SIGHUP, self.handle_hangup)
        try:
            with super().capture_signals():
                yield
        finally:
            loop.remove_signal_handler(signal.SIGHUP)
            signal.signal(signal.SIGHUP, signal.SIG_IGN)  # not the default (exit) while closing

    def handle_hangup(self) -> None:
        """Runs on the event loop, between requests: the gateway swaps its tenants at once."""
        reloader = self.app_state.reloader
        if reloader is None:
            log.warning("SIGHUP: nothing to reload (no gateway settings were given)")
            audit_reload(self.app_state, None, "SIGHUP", ReloadResult(409, "nothing to reload"))
            return
        result = reloader.reload()  # logs what it did, or why it refused
        audit_reload(self.app_state, None, "SIGHUP", result)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        try:
            asyncio.get_running_loop().call_soon_threadsafe(self.app_state.shutdown.set)
        except RuntimeError:  # no loop running yet
            self.app_state.shutdown.set()
        super().handle_exit(sig, frame)
        # uvicorn re-raises the signal after its graceful stop (exit status -15); we stopped
        # cleanly on purpose, so exit 0 instead
        self._captured_signals.clear()

    def bound_port(self) -> int:
        for server in getattr(self, "servers", []):
            for sock in server.sockets:
                return int(sock.getsockname()[1])
        return int(self.config.port)
