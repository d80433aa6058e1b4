"""Operator routes for LoRA adapters at run time, with vLLM's names and bodies:
`POST /v1/load_lora_adapter {lora_name, lora_path}` and `POST /v1/unload_lora_adapter
{lora_name}`. Behind the admin key, as `/admin/*` (off, 404, on a server with neither a
tenants file nor an admin key).

The core reads and checks the files itself; a malformed adapter, a rank above
--max-lora-rank or the shapes of another model is a 400 with the reason, and nothing already
loaded changes. Which tenants may use the adapter is the tenants file's to say (by name).
Each call, done or refused, goes to the audit log (`lora.load`, `lora.unload`).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from headrace.api.audit import audit
from headrace.api.errors import APIError, bad_request
from headrace.api.schemas import error_responses
from headrace.api.state import AppState, app_state
from headrace.gateway.access import Scope
from headrace.gateway.auth import key_from_headers
from headrace.ledger.records import key_id
from headrace.lora.names import LoraError, check_name
from headrace.router.lora_fanout import lora_command

router = APIRouter(tags=["internal"], responses=error_responses(400, 401, 404, 409))
_BODY = ConfigDict(strict=True, extra="forbid")


class LoadLoraBody(BaseModel):
    model_config = _BODY

    lora_name: str = Field(min_length=1, max_length=128)
    lora_path: str = Field(min_length=1, max_length=4096)  # a directory on the server
    base_model: str | None = None  # the served model it adapts (default: the first)


class UnloadLoraBody(BaseModel):
    model_config = _BODY

    lora_name: str = Field(min_length=1, max_length=128)
    lora_int_id: int | None = None  # vLLM clients send it; names are what count here


@router.post("/v1/load_lora_adapter")
async def load_lora_adapter(body: LoadLoraBody, request: Request) -> dict[str, Any]:
    state = app_state(request)
    state.gateway.access.authorize(Scope.ADMIN, request.headers)
    return await _audited(state, request, "lora.load", body.model_dump(), _load(state, body))


@router.post("/v1/unload_lora_adapter")
async def unload_lora_adapter(body: UnloadLoraBody, request: Request) -> dict[str, Any]:
    state = app_state(request)
    state.gateway.access.authorize(Scope.ADMIN, request.headers)
    return await _audited(state, request, "lora.unload", body.model_dump(), _unload(state, body))


async def _audited(
    state: AppState,
    request: Request,
    action: str,
    arguments: dict[str, Any],
    work: Awaitable[dict[str, Any]],
) -> dict[str, Any]:
    """`work`'s answer, into the audit log as it went (refused: its status and message)."""
    who = key_id(key_from_headers(request.headers))
    try:
        result = await work
    except APIError as e:
        audit(state, action, who, arguments, e.status, {"message": e.message})
        raise
    audit(state, action, who, arguments, 200, result)
    return result


async def _load(state: AppState, body: LoadLoraBody) -> dict[str, Any]:
    name = body.lora_name
    try:
        check_name(name)
    except LoraError as e:
        raise bad_request(str(e), "lora_name") from e
    if name in state.adapters or name in state.engines or name in state.lora_busy:
        raise bad_request(f"the name {name!r} is already served", "lora_name")
    base, engine = state.engine_for(body.base_model)
    state.lora_busy.add(name)
    try:
        await lora_command(engine, name, body.lora_path)
    except ValueError as e:
        raise bad_request(str(e), "lora_path") from e
    finally:
        state.lora_busy.discard(name)
    state.adapters[name] = base
    return {"object": "lora_adapter", "id": name, "parent": base, "loaded": True}


async def _unload(state: AppState, body: UnloadLoraBody) -> dict[str, Any]:
    name = body.lora_name
    base = state.adapters.get(name)
    if base is None or name in state.lora_busy:
        raise APIError(
            404, f"adapter {name!r} is not loaded", param="lora_name", code="lora_not_found"
        )
    _, engine = state.engine_for(base)
    state.lora_busy.add(name)
    try:
        await lora_command(engine, name, None)
    except ValueError as e:
        raise bad_request(str(e), "lora_name") from e
    finally:
        state.lora_busy.discard(name)
    del state.adapters[name]  # new requests for it are 404 from here
    return {"object": "lora_adapter", "id": name, "parent": base, "loaded": False}
