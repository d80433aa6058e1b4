"""The real app in process, over fake engines: what `headrace serve` runs (`build_app` behind
`front_door`, its lifespan, the gateway connected to the engines and the metrics), driven with
`httpx.ASGITransport` — no model, no socket, no subprocess.

An app serves one session: its lifespan ends with the shutdown flag set, and its shutdown event
belongs to the session's event loop. So a test builds an app and runs one `session` on it, or
sends one `request` to a fresh app.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import httpx
from factories import MAX_MODEL_LEN, chat_tokenizer, sse_events
from fake_engine import Script, ScriptEngine, text_chunks
from fastapi import FastAPI

from api.route_coverage import record_hits
from headrace.api.app import build_app, front_door
from headrace.config import BatchConfig, ServerConfig
from headrace.engine.frontend.client import EngineClient
from headrace.gateway.base import Gateway, OpenGateway
from headrace.gateway.setup import connect_gateway
from headrace.ledger.writer import Ledger
from headrace.router.metrics import RouterMetrics

T = TypeVar("T")
BASE_URL = "http://127.0.0.1"


def script_engine(script: Script | None = None, **kwargs: Any) -> ScriptEngine:
    """A `ScriptEngine` with the chat tokenizer and the real server's context length; by
    default each request answers "Hello there" in two chunks and ends with `length`."""
    kwargs = {"tokenizer": chat_tokenizer(), "max_model_len": MAX_MODEL_LEN, **kwargs}
    return ScriptEngine(text_chunks(["Hello", " there"]) if script is None else script, **kwargs)


def make_app(
    engines: EngineClient | Mapping[str, EngineClient],
    gateway: Gateway | None = None,
    config: ServerConfig | None = None,
    ledger: Ledger | None = None,
    batch: BatchConfig | None = None,
) -> FastAPI:
    """The app as `headrace serve` builds it; a lone engine is served as model `m`."""
    if not isinstance(engines, Mapping):
        engines = {"m": engines}
    gateway = gateway or OpenGateway()
    app = build_app(engines, gateway, config or ServerConfig(), ledger=ledger, batch=batch)
    state = app.state.headrace
    connect_gateway(state.gateway, lambda: state.engines, state.metrics)
    state.metrics.add_collector(RouterMetrics(lambda: state.engines))
    return app


@asynccontextmanager
async def connect(app: FastAPI, **headers: str) -> AsyncIterator[httpx.AsyncClient]:
    """A client of `app` behind the front door, with the app's lifespan running."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=record_hits(front_door(app)))
        async with httpx.AsyncClient(
            transport=transport, base_url=BASE_URL, headers=headers, timeout=10
        ) as client:
            yield client


def session(app: FastAPI, work: Callable[[httpx.AsyncClient], Awaitable[T]]) -> T:
    """Run `work(client)` against `app` in an event loop of its own."""

    async def go() -> T:
        async with connect(app) as client:
            return await work(client)

    return asyncio.run(go())


def request(
    target: FastAPI | EngineClient, method: str, path: str, **kwargs: Any
) -> httpx.Response:
    """One request (httpx's keyword arguments) to `target`: an app, or an engine to serve."""
    app = target if isinstance(target, FastAPI) else make_app(target)
    return session(app, lambda client: client.request(method, path, **kwargs))


def events(r: httpx.Response) -> list[Any]:
    """The decoded `data:` events of an SSE answer, which must end with `[DONE]`."""
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    data = sse_events(r.text.splitlines())
    assert data and data[-1] == "[DONE]", r.text
    return [json.loads(d) for d in data[:-1]]
