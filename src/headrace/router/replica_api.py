"""What a `headrace serve` offers a front end that uses it as a remote replica, and anyone who
wants its live load.

- `GET /v1/stats`: per model, its context length, whether it serves, its summed `StepStats`
  and, behind a router, each replica's state and load.
- `POST /v1/replica/generate`: one request as token ids with the front end's sampling params
  and options; streams one SSE event per `GenerationChunk` (the first and the last also carry
  the engine's stats), then `[DONE]`. A request that can never fit is a 400 before the stream
  starts.
- `POST /v1/replica/abort`, `GET /v1/replica/tokenizer` (so a front end can serve a model it
  has no files for).

The front end's gateway has already admitted the request, so these routes ask only for the
admin key (when the server has one), never a tenant's.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from headrace.api.errors import APIError, bad_request
from headrace.api.serving import unless_disconnected
from headrace.api.sse import DONE, SSEResponse, encode_event
from headrace.api.state import AppState, app_state
from headrace.engine.client import EngineClient, GenerationChunk
from headrace.request import FinishReason
from headrace.router.wire import chunk_json, options_from_json, params_from_json, stats_json

router = APIRouter()


class ReplicaGenerateBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    request_id: str = Field(min_length=1, max_length=256)
    model: str
    prompt_token_ids: list[int] = Field(min_length=1)
    params: dict[str, Any]
    options: dict[str, Any] = Field(default_factory=dict)


class ReplicaAbortBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    request_id: str
    model: str


@router.get("/v1/stats")
async def stats(request: Request) -> dict[str, Any]:
    state = app_state(request)
    state.gateway.authorize_admin(request.headers)
    models: dict[str, Any] = {}
    for name, engine in list(state.engines.items()):
        describe = getattr(engine, "describe", None)  # a router tells of its replicas
        models[name] = {
            "max_model_len": engine.max_model_len,
            "healthy": engine.is_healthy,
            "stats": stats_json(engine.stats()),
            **(describe() if callable(describe) else {}),
        }
    return {"loading": state.loading or not state.engines, "models": models}


@router.get("/v1/replica/tokenizer", include_in_schema=False)
async def tokenizer(request: Request, model: str) -> dict[str, Any]:
    state = app_state(request)
    state.gateway.authorize_admin(request.headers)
    _, engine = state.engine_for(model)
    tok = engine.tokenizer
    return {"tokenizer": tok.backend.to_str(), "config": tok.config}


@router.post("/v1/replica/abort", include_in_schema=False)
async def abort(body: ReplicaAbortBody, request: Request) -> JSONResponse:
    state = app_state(request)
    state.gateway.authorize_admin(request.headers)
    engine = state.engines.get(body.model)
    if engine is not None:
        await engine.abort(body.request_id)
    return JSONResponse({"aborted": body.request_id})


@router.post("/v1/replica/generate", include_in_schema=False)
async def generate(body: ReplicaGenerateBody, request: Request) -> Response:
    state = app_state(request)
    state.gateway.authorize_admin(request.headers)
    _, engine = state.engine_for(body.model)
    try:
        params = params_from_json(body.params)
        options = options_from_json(body.options)
    except (TypeError, ValueError) as e:
        raise bad_request(f"bad replica request: {e}") from e
    chunks = engine.generate(body.request_id, body.prompt_token_ids, params, options)
    first = await _first(state, request, chunks)
    return SSEResponse(_events(first, chunks, engine), on_shutdown=state.shutdown.wait)


async def _first(
    state: AppState, request: Request, chunks: AsyncIterator[GenerationChunk]
) -> GenerationChunk:
    """The first chunk before the headers go out, so that a refusal is still a status code."""
    try:
        return await unless_disconnected(state, request, anext(chunks))
    except ValueError as e:
        raise bad_request(str(e)) from e
    except StopAsyncIteration:
        raise APIError(500, "the engine ended the request without a result") from None
    except APIError:
        await _close(chunks)
        raise
    except Exception as e:
        await _close(chunks)
        raise APIError(503, f"the engine failed: {e}", type="unavailable_error") from e


async def _events(
    first: GenerationChunk, chunks: AsyncIterator[GenerationChunk], engine: EngineClient
) -> AsyncGenerator[bytes, None]:
    """The chunks as events; the first and the last also carry the engine's stats, so that the
    front end's view of this server's load is as fresh as a local replica's."""
    try:
        chunk = first
        while True:
            data = chunk_json(chunk)
            if chunk is first or chunk.finished:
                data["stats"] = stats_json(engine.stats())
            yield encode_event(data)
            if chunk.finished:
                break
            try:
                chunk = await anext(chunks)
            except Exception as e:  # tell the front end, which then fails the request
                failed = GenerationChunk(first.request_id, "", [], FinishReason.ERROR, error=str(e))
                yield encode_event(chunk_json(failed))
                break
    finally:
        await _close(chunks)
    yield DONE


async def _close(chunks: AsyncIterator[GenerationChunk]) -> None:
    aclose = getattr(chunks, "aclose", None)
    if aclose is not None:
        await aclose()
