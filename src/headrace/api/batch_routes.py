"""OpenAI's Batch API over HTTP: `/v1/files` (upload a batch's input, read, list, delete) and
`/v1/batches` (create, read, list, cancel). Thin: the work is `headrace.batches.service`'s.

Every route acts for the caller's tenant (its key; the open server's one tenant); another
tenant's file or batch is a 404. The admin key reads, lists and cancels any tenant's batches
(a cancel so made goes to the audit log). 404 for all of them on a server started with
`--batch-dir off`.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, File, Form, Request, UploadFile
from fastapi.responses import Response
from pydantic import BaseModel

from headrace.api.audit import audit
from headrace.api.errors import APIError
from headrace.api.schemas import error_responses
from headrace.api.state import AppState, app_state
from headrace.batches.service import BatchError, Batches
from headrace.gateway.access import Scope
from headrace.gateway.auth import key_from_headers
from headrace.gateway.errors import GatewayError
from headrace.ledger.records import key_id

router = APIRouter(tags=["batches"], responses=error_responses(400, 401, 404, 413))
T = TypeVar("T")


@router.post("/v1/files")
async def upload_file(
    request: Request, file: Annotated[UploadFile, File()], purpose: Annotated[str, Form()]
) -> dict[str, Any]:
    """multipart/form-data: `file` (JSONL of requests) and `purpose` ("batch")."""
    batches, tenant = _caller(request)
    data = await file.read()
    name = file.filename or "upload.jsonl"
    return await _answer(batches.upload(tenant, name, purpose, data))


@router.get("/v1/files")
async def list_files(request: Request, purpose: str | None = None) -> dict[str, Any]:
    batches, tenant = _caller(request)
    return await _answer(batches.files(tenant, purpose))


@router.get("/v1/files/{file_id}")
async def get_file(request: Request, file_id: str) -> dict[str, Any]:
    batches, tenant = _caller(request)
    return await _answer(batches.file(tenant, file_id))


@router.get("/v1/files/{file_id}/content")
async def file_content(request: Request, file_id: str) -> Response:
    batches, tenant = _caller(request)
    data = await _answer(batches.content(tenant, file_id))
    return Response(data, media_type="application/jsonl")


@router.delete("/v1/files/{file_id}")
async def delete_file(request: Request, file_id: str) -> dict[str, Any]:
    batches, tenant = _caller(request)
    return await _answer(batches.delete(tenant, file_id))


class BatchCreate(BaseModel):
    """OpenAI's batch request (the values are checked by the service, saying which is wrong)."""

    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None


@router.post("/v1/batches")
async def create_batch(body: BatchCreate, request: Request) -> dict[str, Any]:
    batches, tenant = _caller(request)
    who = key_id(key_from_headers(request.headers))
    return await _answer(batches.create(tenant, body.model_dump(), who))


@router.get("/v1/batches")
async def list_batches(request: Request, limit: int = 20, after: str | None = None) -> Any:
    """The caller's batches, newest first; the admin key's: every tenant's."""
    batches, tenant = _caller_or_admin(request)
    return await _answer(batches.batches(tenant, limit, after))


@router.get("/v1/batches/{batch_id}")
async def get_batch(request: Request, batch_id: str) -> dict[str, Any]:
    batches, tenant = _caller_or_admin(request)
    return await _answer(batches.batch(tenant, batch_id))


@router.post("/v1/batches/{batch_id}/cancel")
async def cancel_batch(request: Request, batch_id: str) -> dict[str, Any]:
    """The owner's cancel; the admin key's cancel of any batch goes to the audit log."""
    batches, tenant = _caller_or_admin(request)
    answer = await _answer(batches.cancel(tenant, batch_id))
    if tenant is None:
        who = key_id(key_from_headers(request.headers))
        audit(app_state(request), "batch.cancel", who, {"batch_id": batch_id}, 200, answer)
    return answer


def _caller(request: Request) -> tuple[Batches, str]:
    """The Batch API and the caller's tenant."""
    state: AppState = app_state(request)
    if state.batches is None:
        raise APIError(
            404, "this server runs no Batch API (--batch-dir off, or its directory could not be "
            "opened: the server's log says why)",
        )  # fmt: skip
    return state.batches, state.gateway.authenticate(request.headers).name


def _caller_or_admin(request: Request) -> tuple[Batches, str | None]:
    """As `_caller`, but None for the admin key's holder (who is no tenant: a tenant's key is
    tried first)."""
    try:
        return _caller(request)
    except GatewayError:
        if not app_state(request).gateway.access.allows(Scope.ADMIN, request.headers):
            raise
        batches = app_state(request).batches
        assert batches is not None  # _caller raised a GatewayError, not the 404
        return batches, None


async def _answer(work: Awaitable[T]) -> T:
    try:
        return await work
    except BatchError as e:
        raise APIError(e.status, e.message, param=e.param) from e
