"""`headrace serve`: the HTTP server over one model (default: the embedded Gemma 3 270M) or
several, each with one or more replicas behind a router (`headrace.router.deploy`).

The HTTP server comes up first and answers /health with 503 while the model loads in the
background; one log line says when it is ready. SIGINT / SIGTERM: streams in flight get a final
error event, engine processes are stopped, nothing is left running. SIGHUP reloads the
tenants file (`gateway/reload.py`); it never stops the server.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from headrace.api.app import build_app
from headrace.api.http_protocol import fit_fd_limit
from headrace.api.state import AppState
from headrace.commands.serve_load import DeploymentLoader
from headrace.commands.serve_server import Server, uvicorn_config
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
from headrace.gateway.reload import GatewayReloader
from headrace.gateway.setup import connect_gateway, setup_gateway
from headrace.ledger.setup import open_ledger
from headrace.ledger.writer import Ledger
from headrace.lora.names import check_name
from headrace.metrics.tracing import otlp_tracer
from headrace.router.deploy import ModelSpec, parse_model_specs
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
    loader = DeploymentLoader(specs, config, replica_urls or [])
    try:
        ledger = open_ledger(config.ledger)
    except ValueError as e:
        log.error("%s", e)
        return 2
    app = build_app(
        {}, gateway or OpenGateway(), server_cfg, loader=loader.load, ledger=ledger,
        batch=config.batch,
    )  # fmt: skip
    state = loader.state = app.state.headrace
    if not _wire_state(state, config, specs, reloader):
        return 2
    fit_fd_limit(server_cfg.max_connections)
    server = loader.server = Server(uvicorn_config(app, server_cfg, state), state)
    try:
        server.run()
    finally:
        _close_sinks(state, ledger)
    if loader.error is not None:
        log.error("model failed to load: %s", loader.error)
        return 1
    return 0


def _wire_state(
    state: AppState,
    config: HeadraceConfig,
    specs: list[ModelSpec],
    reloader: GatewayReloader | None,
) -> bool:
    """Connect the app's state to the gateway, the router's metrics and the tracer; False (and
    a logged reason) if the tracer cannot be had."""
    state.reloader = reloader
    state.adapters = {lora: specs[0].name for lora in config.model.lora_paths}
    connect_gateway(state.gateway, lambda: state.engines, state.metrics)
    state.metrics.add_collector(RouterMetrics(lambda: state.engines))
    endpoint = config.server.otlp_traces_endpoint
    if endpoint is not None:
        try:
            state.metrics.tracer = otlp_tracer(endpoint)
        except ValueError as e:  # the SDK is not installed
            log.error("%s", e)
            return False
    return True


def _close_sinks(state: AppState, ledger: Ledger | None) -> None:
    if ledger is not None:
        ledger.close()  # done already when the app stopped cleanly
    if state.metrics.tracer is not None:
        state.metrics.tracer.close()  # the spans still batched go out


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


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    log.setLevel(min(log.getEffectiveLevel(), logging.INFO))  # loading and ready lines always
