"""What a `headrace serve` offers a front end that uses it as a remote replica, and anyone who
wants its live load.

- `GET /v1/stats`: per model, its context length, whether it serves, its summed `StepStats`
  and, behind a router, each replica's state and load.
- `POST /v1/replica/generate`: one request as token ids with the front end's sampling params
  and options (`router/wire.py`'s `ReplicaGenerateBody`, validated: a bad field is a 400 naming
  it); streams one SSE event per `GenerationChunk` (the first and the last also carry the
  engine's stats),
  then `[DONE]`. A request that can never fit is a 400 before the stream starts. While the
  request waits, and between chunks, an SSE comment (`: keep-alive`) goes out every
  `KEEPALIVE_S`, so that the front end can tell a slow request from a frozen server.
- `POST /v1/replica/abort`, `GET /v1/replica/tokenizer` (so a front end can serve a model it
  has no files for).

The front end's gateway has already admitted the request, so these routes ask no tenant's key:
who may call them is `InternalAccess`'s rule (the admin key, or `--replica-api` on an open
server), checked before the body is.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import msgspec
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from headrace.api.arrival import arrival_time
from headrace.api.errors import APIError, bad_request, describe_validation_errors
from headrace.api.outcomes import engine_failure
from headrace.api.schemas import error_responses
from headrace.api.serving import unless_disconnected
from headrace.api.sse import DONE, SSEResponse, encode_event
from headrace.api.state import AppState, app_state
from headrace.engine.frontend.client import EngineClient, GenerationChunk
from headrace.gateway.access import Scope
from headrace.loader.tokenizer import Tokenizer as ModelTokenizer
from headrace.request import FinishReason
from headrace.router.wire import (
    ReplicaAbortBody,
    ReplicaGenerateBody,
    WireError,
    chunk_json,
    decode,
    stats_json,
)

KEEPALIVE_S = 2.0  # a front end's read timeout (--replica-read-timeout-s) must exceed it
KEEPALIVE = b": keep-alive\n\n"

T = TypeVar("T")


def _access(scope: Scope) -> Callable[[Request], Awaitable[None]]:
    async def check(request: Request) -> None:
        app_state(request).gateway.access.authorize(scope, request.headers)

    return check


async def _body(request: Request, kind: type[T]) -> T:
    """The body as the wire type `kind`; one that is not is a 400 naming the field, as a bad
    field of the public API is."""
    try:
        return decode(await request.body(), kind)
    except WireError as e:
        raise bad_request(*describe_validation_errors(e.errors())) from e


def _body_schema(kind: type[Any]) -> dict[str, Any]:
    """The route's body in /openapi.json, so that fuzzing and clients see it: msgspec's JSON
    schema of `kind` with its `$defs` inlined (they are not OpenAPI's components)."""
    schema = msgspec.json.schema(kind)
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = str(node.get("$ref", ""))
            if ref.startswith("#/$defs/"):
                return inline(defs[ref.removeprefix("#/$defs/")])
            return {k: inline(v) for k, v in node.items()}
        return [inline(v) for v in node] if isinstance(node, list) else node

    content = {"application/json": {"schema": inline(schema)}}
    return {"requestBody": {"required": True, "content": content}}


router = APIRouter()
# In the schema (tagged internal) so that fuzzing and clients see them; the access rule says
# who may call them.
_replica = APIRouter(
    dependencies=[Depends(_access(Scope.REPLICA))],
    tags=["internal"],
    responses=error_responses(400, 401, 404, 503),
)


@router.get("/v1/stats", dependencies=[Depends(_access(Scope.STATS))])
async def stats(request: Request) -> dict[str, Any]:
    state = app_state(request)
    models: dict[str, Any] = {}
    for name, engine in list(state.engines.items()):
        step = engine.stats()
        models[name] = {
            "max_model_len": engine.max_model_len,
            "healthy": engine.is_healthy,
            "stats": stats_json(step),
            "prefix_cache_hit_rate": round(step.prefix_cache_hit_rate, 4),
            **engine.describe(),  # a router tells of its replicas
        }
    return {"loading": state.loading or not state.engines, "models": models}


@_replica.get("/v1/replica/tokenizer")
async def tokenizer(request: Request, model: str) -> dict[str, Any]:
    _, engine = app_state(request).engine_for(model)
    tok = engine.tokenizer
    if not isinstance(tok, ModelTokenizer):  # e.g. a test's stand-in: no file to send
        raise APIError(404, f"model {model!r} has no tokenizer file to send")
    return {"tokenizer": tok.backend.to_str(), "config": tok.config,
            "architecture": tok.architecture}  # fmt: skip


@_replica.post("/v1/replica/abort", openapi_extra=_body_schema(ReplicaAbortBody))
async def abort(request: Request) -> JSONResponse:
    body = await _body(request, ReplicaAbortBody)
    engine = app_state(request).engines.get(body.model)
    if engine is not None:
        await engine.abort(body.request_id)
    return JSONResponse({"aborted": body.request_id})


@_replica.post("/v1/replica/generate", openapi_extra=_body_schema(ReplicaGenerateBody))
async def generate(request: Request) -> Response:
    body = await _body(request, ReplicaGenerateBody)
    state = app_state(request)
    _, engine = state.engine_for(body.model)
    _check_vocabulary(engine, body)
    try:
        params = body.params.sampling_params()
        options = body.options.generate_options(arrival_time(request.scope))
    except ValueError as e:
        raise bad_request(f"bad replica request: {e}") from e
    pending = _Pending(engine.generate(body.request_id, body.prompt_token_ids, params, options))
    first = await _first(state, request, pending)
    events = _events(body.request_id, first, pending, engine)
    return SSEResponse(events, on_shutdown=state.shutdown.wait)


router.include_router(_replica)


def _check_vocabulary(engine: EngineClient, body: ReplicaGenerateBody) -> None:
    vocab = int(engine.tokenizer.vocab_size)
    for field, ids in [("prompt_token_ids", body.prompt_token_ids), *body.params.token_ids()]:
        bad = next((t for t in ids if t >= vocab), None)
        if bad is not None:
            raise bad_request(
                f"{field}: token id {bad} is outside the vocabulary [0, {vocab})", field
            )


class _Pending:
    """The engine's chunks, read with a timeout: the read in progress survives a timeout (to
    be awaited again after a keep-alive), which `asyncio.wait_for` on `anext` would cancel."""

    def __init__(self, chunks: AsyncIterator[GenerationChunk]) -> None:
        self.chunks = chunks
        self._next: asyncio.Future[GenerationChunk] | None = None

    async def next(self, timeout: float) -> GenerationChunk | None:
        """The next chunk, or None if none came within `timeout` seconds."""
        if self._next is None:
            self._next = asyncio.ensure_future(anext(self.chunks))
        done, _ = await asyncio.wait({self._next}, timeout=timeout)
        if not done:
            return None
        task, self._next = self._next, None
        return task.result()

    async def close(self) -> None:
        if self._next is not None:  # the generator is mid-read: end that read first
            self._next.cancel()
            with contextlib.suppress(BaseException):
                await self._next
        aclose = getattr(self.chunks, "aclose", None)
        if aclose is not None:
            await aclose()


async def _first(state: AppState, request: Request, pending: _Pending) -> GenerationChunk | None:
    """The first chunk before the headers go out, so that a refusal is still a status code;
    None when it takes longer than `KEEPALIVE_S` (it waits in a queue: the stream starts, with
    keep-alives, rather than leave the front end without a byte)."""
    try:
        return await unless_disconnected(state, request, pending.next(KEEPALIVE_S))
    except Exception as e:
        await pending.close()
        raise engine_failure(e, "a replica request") from e


async def _events(
    request_id: str, first: GenerationChunk | None, pending: _Pending, engine: EngineClient
) -> AsyncGenerator[bytes, None]:
    """The chunks as events, keep-alives between them; the first and the last also carry the
    engine's stats, so that the front end's view of this server's load is as fresh as a local
    replica's."""
    chunk, sent = first, 0
    try:
        while True:
            if chunk is None:
                try:
                    chunk = await pending.next(KEEPALIVE_S)
                except Exception as e:  # tell the front end, which then fails the request
                    error = str(e) or type(e).__name__
                    failed = GenerationChunk(request_id, "", [], FinishReason.ERROR, error=error)
                    yield encode_event(chunk_json(failed))
                    break
                if chunk is None:
                    yield KEEPALIVE
                    continue
            data = chunk_json(chunk)
            if sent == 0 or chunk.finished:
                data["stats"] = stats_json(engine.stats())
            yield encode_event(data)
            sent += 1
            if chunk.finished:
                break
            chunk = None
    finally:
        await pending.close()
    yield DONE
