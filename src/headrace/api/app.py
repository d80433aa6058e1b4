"""The FastAPI application: `build_app(engines, gateway, config)`.

`engines` maps a served model name to its engine client (a replica, or later a router over
several); a request's `model` picks one, no `model` means the first. With `loader`, the app
starts with no engines and answers /health with 503 until the loader's engines arrive, so the
HTTP server can come up before the weights are in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.types import ASGIApp

from headrace.api import (
    admin,
    batch_routes,
    chat,
    dashboard,
    generate,
    lora_admin,
    openai,
    replica_api,
    responses,
    usage,
)
from headrace.api.arrival import ArrivalClock
from headrace.api.batch_call import in_process
from headrace.api.early_refusal import EarlyRefusal
from headrace.api.errors import install_error_handlers
from headrace.api.host_guard import HostGuard, HostPolicy, with_cors
from headrace.api.limits import BodySizeLimit
from headrace.api.state import AppState, app_state
from headrace.batches.collector import BatchMetrics
from headrace.batches.service import Batches
from headrace.config import BatchConfig, ServerConfig
from headrace.engine.frontend.client import EngineClient
from headrace.gateway.access import Scope
from headrace.gateway.base import Gateway
from headrace.ledger.collector import LedgerMetrics
from headrace.ledger.writer import Ledger
from headrace.metrics.prometheus import Metrics

log = logging.getLogger("headrace.api")

EngineLoader = Callable[[], Awaitable[Mapping[str, EngineClient]]]
_FORM_SLACK = 64 * 1024  # a multipart upload's framing and fields around the file itself


def build_app(
    engines: Mapping[str, EngineClient],
    gateway: Gateway,
    config: ServerConfig,
    *,
    loader: EngineLoader | None = None,
    metrics: Metrics | None = None,
    ledger: Ledger | None = None,
    batch: BatchConfig | None = None,
) -> FastAPI:
    """The HTTP front end over `engines`; engines from `loader` are the app's to close, and
    so is `ledger` (flushed and closed when the app stops). With `batch` (enabled), the Batch
    API, whose batches left unfinished by the last stop resume when the app starts."""
    state = AppState(dict(engines), gateway, config, metrics or Metrics(), ledger=ledger)
    state.metrics.watch_engines(lambda: state.engines)
    if ledger is not None:
        state.metrics.add_collector(LedgerMetrics(ledger))
    app = FastAPI(
        title="Headrace", version="0.1.0", lifespan=_lifespan(state, loader),
        # Swagger UI and ReDoc load their scripts from a CDN: not served at all.
        openapi_url=None, docs_url=None, redoc_url=None,
    )  # fmt: skip
    app.state.headrace = state
    install_error_handlers(app)
    state.batches = _open_batches(app, gateway, config, batch)
    uploads = None
    if state.batches is not None:
        state.metrics.add_collector(BatchMetrics(state.batches.runner))
        uploads = ("/v1/files", state.batches.cfg.batch_max_file_bytes + _FORM_SLACK)
    app.add_middleware(BodySizeLimit, max_bytes=config.max_body_bytes, uploads=uploads)
    _add_routes(app, config)
    return app


def _add_routes(app: FastAPI, config: ServerConfig) -> None:
    for module in (generate, openai, chat, responses):
        app.include_router(module.router)
    app.include_router(replica_api.router)  # /v1/stats and what a front end routing here uses
    app.include_router(dashboard.router)  # /dashboard, its files and the data it polls
    app.include_router(admin.router)  # /admin/reload
    app.include_router(lora_admin.router)  # /v1/load_lora_adapter, /v1/unload_lora_adapter
    app.include_router(usage.router)  # /v1/usage, /v1/audit
    app.include_router(batch_routes.router)  # /v1/files, /v1/batches
    app.add_api_route(
        "/health", health, methods=["GET"], responses={503: {"description": "not ready"}}
    )
    app.add_api_route("/metrics", metrics_route, methods=["GET"], include_in_schema=False)
    app.openapi = _openapi_without_422(app)  # type: ignore[method-assign]
    if config.api_docs:
        app.add_api_route("/openapi.json", openapi_route, methods=["GET"], include_in_schema=False)


def _open_batches(
    app: FastAPI, gateway: Gateway, config: ServerConfig, batch: BatchConfig | None
) -> Batches | None:
    """The Batch API, its lines run in process through `app`; None when off, or when its
    directory cannot be opened (logged: the server serves all else)."""
    if batch is None or not batch.enabled:
        return None
    try:
        return Batches(batch, in_process(app, gateway), config.max_body_bytes)
    except (OSError, sqlite3.Error) as e:
        log.error("no Batch API: its directory cannot be opened: %s", e)
        return None


def front_door(app: FastAPI) -> ASGIApp:
    """What the HTTP server runs: `app` behind the arrival clock, the Host and Origin checks,
    CORS (only with `--allowed-origins`) and the refusals made from the headers alone, all
    outside FastAPI's own middleware so that a refusal costs least."""
    state: AppState = app.state.headrace
    config = state.config
    policy = HostPolicy.build(config.host, config.host_list, config.origin_list)
    inner = with_cors(EarlyRefusal(app, state), config.origin_list)
    return ArrivalClock(HostGuard(inner, policy))


def _openapi_without_422(app: FastAPI) -> Callable[[], dict[str, Any]]:
    """Validation errors are answered with 400 (like OpenAI): drop FastAPI's 422 entries."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            for path in build().get("paths", {}).values():
                for operation in path.values():
                    operation.get("responses", {}).pop("422", None)
        assert app.openapi_schema is not None
        return app.openapi_schema

    return openapi


async def health(request: Request) -> JSONResponse:
    """200 when every engine is up; 503 while loading, after a failure, or shutting down. The
    details (models, replicas, pids, URLs) only for whom `InternalAccess` lets see them."""
    state = app_state(request)
    status, body = state.health(details=state.gateway.access.allows(Scope.HEALTH, request.headers))
    return JSONResponse(body, status_code=status)


async def openapi_route(request: Request) -> JSONResponse:
    """`--api-docs`: the schema, for whom `InternalAccess` lets see it (scope DOCS)."""
    app_state(request).gateway.access.authorize(Scope.DOCS, request.headers)
    return JSONResponse(request.app.openapi())


async def metrics_route(request: Request) -> Response:
    state = app_state(request)
    state.gateway.access.authorize(Scope.METRICS, request.headers)
    body, content_type = state.metrics.render()
    return Response(body, media_type=content_type)


def _lifespan(
    state: AppState, loader: EngineLoader | None
) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        task = asyncio.create_task(_load(state, loader)) if loader is not None else None
        if state.batches is not None:  # their lines wait (503, retried) until a model is up
            state.batches.runner.resume()
        try:
            yield
        finally:
            state.shutdown.set()
            if state.batches is not None:  # before the engines: their lines in flight abort
                await state.batches.close()
            if task is not None:
                task.cancel()
                loaded = await asyncio.gather(task, return_exceptions=True)
                await _close_all(loaded[0] if isinstance(loaded[0], dict) else {})
            if state.ledger is not None:  # after the requests: their records are in
                await asyncio.to_thread(state.ledger.close)

    return lifespan


async def _load(state: AppState, loader: EngineLoader | None) -> dict[str, EngineClient]:
    assert loader is not None
    state.loading = True
    try:
        engines = dict(await loader())
    except Exception as e:
        log.error("loading the model failed: %s", e, exc_info=True)
        state.load_error = str(e) or type(e).__name__
        raise
    finally:
        state.loading = False
    state.engines.update(engines)
    return engines


async def _close_all(engines: Mapping[str, EngineClient]) -> None:
    for name, engine in engines.items():
        try:
            await engine.close()
        except Exception:
            log.warning("closing engine %s failed", name, exc_info=True)
