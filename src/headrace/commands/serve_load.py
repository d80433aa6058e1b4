"""The background load of `headrace serve`: the deployment starts once the server holds its
port (so /health answers 503 meanwhile), with a progress line every few seconds and one line
when it is ready."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Mapping
from typing import Any

from headrace.api.state import AppState
from headrace.commands.serve_server import Server
from headrace.config import HeadraceConfig
from headrace.router.deploy import ModelSpec, start_deployment

log = logging.getLogger("headrace.serve")


class DeploymentLoader:
    """`load` is the app's loader; `server` and `state` are set before the server runs. A load
    that fails stops the server and is kept in `error`."""

    def __init__(self, specs: list[ModelSpec], config: HeadraceConfig, urls: list[str]) -> None:
        self.specs, self.config, self.replica_urls = specs, config, urls
        self.server: Server | None = None
        self.state: AppState | None = None
        self.error: BaseException | None = None
        self.background: list[asyncio.Task[None]] = []  # held here: the loop keeps weak refs

    async def load(self) -> Mapping[str, Any]:
        t0 = time.monotonic()
        for spec in self.specs:
            where = spec.model or "Gemma 3 270M (embedded)"
            log.info("Loading model %s: %s x %d ...", spec.name, where, spec.replicas)
        server, state = self.server, self.state
        assert server is not None and state is not None
        while not server.started:  # load only once the port is ours: /health answers meanwhile
            await asyncio.sleep(0.02)
        engines = await self._start(server, t0)
        if self.config.router.ray_namespace is not None:
            self.background.append(await _share_limits(state))
        # What is loaded by now lives as long as the server: keep it out of the collector's
        # scans. A full collection over it took 120-140 ms on the event loop, mid-burst.
        gc.collect()
        gc.freeze()
        log.info(
            "Headrace ready: model %s on http://%s:%d (loaded in %.1f s)",
            ", ".join(engines), self.config.server.host, server.bound_port(),
            time.monotonic() - t0,
        )  # fmt: skip
        return engines

    async def _start(self, server: Server, t0: float) -> Mapping[str, Any]:
        ticker = asyncio.create_task(_tick(", ".join(s.name for s in self.specs), t0))
        try:
            return await start_deployment(self.specs, self.config, self.replica_urls)
        except BaseException as e:
            self.error = e
            server.should_exit = True  # a server without a model is of no use
            raise
        finally:
            ticker.cancel()


async def _share_limits(state: AppState) -> asyncio.Task[None]:
    """Front ends of one Ray namespace share each tenant's limits (gateway/shared_limits.py);
    the leases go back when the server stops."""
    from headrace.gateway.gateway import TenantGateway
    from headrace.gateway.shared_limits import SharedLimits

    gateway = state.gateway
    shared = await SharedLimits.start(gateway) if isinstance(gateway, TenantGateway) else None

    async def close_on_shutdown() -> None:
        await state.shutdown.wait()
        if shared is not None:
            await shared.close()

    return asyncio.create_task(close_on_shutdown(), name="headrace-shared-limits-close")


async def _tick(what: str, t0: float, every_s: float = 5.0) -> None:
    """Progress while the weights load: a line every few seconds, so a slow start is visible."""
    while True:
        await asyncio.sleep(every_s)
        log.info("... still loading %s (%.0f s)", what, time.monotonic() - t0)
