"""`headrace serve`: the HTTP server over one model (default: the embedded Gemma 3 270M) or
several, each with one or more replicas behind a router (`headrace.router.deploy`).

The HTTP server comes up first and answers /health with 503 while the model loads in the
background; one log line says when it is ready. SIGINT / SIGTERM: streams in flight get a final
error event, engine processes are stopped, nothing is left running. SIGHUP reloads the
tenants file (`gateway/reload.py`); it never stops the server.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn

from headrace.api.app import build_app, front_door
from headrace.api.audit import audit_reload
from headrace.api.http_parsers import uvicorn_options
from headrace.api.http_protocol import FrontDoorLimits, fit_fd_limit
from headrace.api.state import AppState
from headrace.config import (
    AutoscaleConfig,
    BatchConfig,
    CacheConfig,
    GatewayConfig,
    HeadraceConfig,
    LedgerConfig,
    ModelConfig,
    RouterConfig,
    SchedulerConfig,
    ServerConfig,
    add_config_args,
)
from headrace.gateway.base import Gateway, OpenGateway
from headrace.gateway.reload import GatewayReloader, ReloadResult
from headrace.gateway.setup import connect_gateway, setup_gateway
from headrace.ledger.setup import open_ledger
from headrace.lora.adapter import check_name
from headrace.metrics.tracing import otlp_tracer
from headrace.router.deploy import ModelSpec, parse_model_specs, start_deployment
from headrace.router.metrics import RouterMetrics

log = logging.getLogger("headrace.serve")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_args(parser, ModelConfig, skip=("model",))
    parser.add_argument(
        "--model", action="append", metavar="[NAME=]PATH[:N]",
        help="GGUF file or Hugging Face directory, served as NAME with N replicas; repeat it "
        "to serve several models (default: Gemma 3 270M)",
    )  # fmt: skip
    for cls in (
        CacheConfig,
        SchedulerConfig,
        ServerConfig,
        GatewayConfig,
        RouterConfig,
        AutoscaleConfig,
        LedgerConfig,
        BatchConfig,
    ):
        add_config_args(parser, cls)
    parser.add_argument(
        "--no-ledger", dest="ledger", action="store_const", const="off",
        help="keep no usage ledger or audit log (the same as --ledger off)",
    )  # fmt: skip
    parser.add_argument(
        "--replica-url", action="append", default=[], metavar="URL",
        help="another `headrace serve` to route to as well, as a replica of each model it "
        "serves (repeatable)",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    models, args.model = args.model or [None], None
    try:
        config = HeadraceConfig.from_args(args)
    except ValueError as e:
        log.error("%s", e)
        return 2
    _setup_logging(config.server.log_level)
    try:  # a bad tenants file stops the server before it loads anything
        gateway, reloader = setup_gateway(config.gateway, os.environ)
        name, replicas = config.model.served_model_name, config.router.replicas
        specs = parse_model_specs(models, name, replicas, served_name)
        check_lora_names(config.model.lora_paths, [s.name for s in specs])
    except ValueError as e:
        log.error("%s", e)
        return 2
    return serve(config, gateway, specs=specs, replica_urls=args.replica_url, reloader=reloader)


def serve(
    config: HeadraceConfig,
    gateway: Gateway | None = None,
    *,
    specs: list[ModelSpec] | None = None,
    replica_urls: list[str] | None = None,
    reloader: GatewayReloader | None = None,
) -> int:
    """Run until a signal; 0 on a clean stop, 1 if the model failed to load."""
    model_cfg, server_cfg = config.model, config.server
    if specs is None:
        specs = parse_model_specs(
            [model_cfg.model], model_cfg.served_model_name, config.router.replicas, served_name
        )
    outcome: dict[str, BaseException] = {}
    server: _Server | None = None
    background: list[asyncio.Task[None]] = []  # held here: the loop keeps weak references

    async def load() -> Mapping[str, Any]:
        t0 = time.monotonic()
        for spec in specs:
            where = spec.model or "Gemma 3 270M (embedded)"
            log.info("Loading model %s: %s x %d ...", spec.name, where, spec.replicas)
        assert server is not None
        while not server.started:  # load only once the port is ours: /health answers meanwhile
            await asyncio.sleep(0.02)
        ticker = asyncio.create_task(_tick(", ".join(s.name for s in specs), t0))
        try:
            engines = await start_deployment(specs, config, replica_urls or [])
        except BaseException as e:
            outcome["error"] = e
            if server is not None:
                server.should_exit = True  # a server without a model is of no use
            raise
        finally:
            ticker.cancel()
        if config.router.ray_namespace is not None:
            background.append(await _share_limits(state))
        # What is loaded by now lives as long as the server: keep it out of the collector's
        # scans. A full collection over it took 120-140 ms on the event loop, mid-burst.
        gc.collect()
        gc.freeze()
        log.info(
            "Headrace ready: model %s on http://%s:%d (loaded in %.1f s)",
            ", ".join(engines), server_cfg.host, server.bound_port(), time.monotonic() - t0,
        )  # fmt: skip
        return engines

    try:
        ledger = open_ledger(config.ledger)
    except ValueError as e:
        log.error("%s", e)
        return 2
    app = build_app(
        {}, gateway or OpenGateway(), server_cfg, loader=load, ledger=ledger, batch=config.batch
    )
    state = app.state.headrace
    state.reloader = reloader
    state.adapters = {lora: specs[0].name for lora in model_cfg.lora_paths}
    connect_gateway(state.gateway, lambda: state.engines, state.metrics)
    state.metrics.add_collector(RouterMetrics(lambda: state.engines))
    if server_cfg.otlp_traces_endpoint is not None:
        try:
            state.metrics.tracer = otlp_tracer(server_cfg.otlp_traces_endpoint)
        except ValueError as e:  # the SDK is not installed
            log.error("%s", e)
            return 2
    fit_fd_limit(server_cfg.max_connections)
    uv_config = uvicorn.Config(
        front_door(app), host=server_cfg.host, port=server_cfg.port, workers=1, lifespan="on",
        log_level=server_cfg.log_level, access_log=server_cfg.log_level == "debug",
        timeout_graceful_shutdown=5, timeout_keep_alive=30, loop="uvloop",
        **uvicorn_options(
            FrontDoorLimits.from_config(server_cfg), server_cfg.http_parser,
            state.metrics.send_timeouts,
        ),
    )  # fmt: skip
    server = _Server(uv_config, app.state.headrace)
    try:
        server.run()
    finally:
        if ledger is not None:
            ledger.close()  # done already when the app stopped cleanly
        if state.metrics.tracer is not None:
            state.metrics.tracer.close()  # the spans still batched go out
    if "error" in outcome:
        log.error("model failed to load: %s", outcome["error"])
        return 1
    return 0


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


def check_lora_names(adapters: Mapping[str, str], models: list[str]) -> None:
    """ValueError unless the --lora adapters go over one model, each under a name of its own."""
    if adapters and len(models) > 1:
        raise ValueError("--lora adapters go over one base model; several --model given")
    for name in adapters:
        check_name(name)  # the core would refuse it only after loading the model
        if name in models:
            raise ValueError(f"--lora {name}=...: the name is the base model's; pick another")


def served_name(model: str | None) -> str:
    """What clients put in `model` when --served-model-name is not given."""
    if model is None:
        return "gemma-3-270m"
    path = Path(model)
    return path.stem if path.suffix == ".gguf" else path.name


class _Server(uvicorn.Server):
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


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    log.setLevel(min(log.getEffectiveLevel(), logging.INFO))  # loading and ready lines always
