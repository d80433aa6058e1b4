"""Operator routes: `POST /admin/reload` reloads the tenants file (and the admin key file),
as SIGHUP does; each reload goes to the audit log. Behind the admin key (`InternalAccess`,
checked before anything else); off (404) on a server with neither a tenants file nor an admin
key.

200 with what changed; 400 with the validation message a start would give (the old tenants
stay); 409 when the server has nothing to reload.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from headrace.api.audit import audit_reload
from headrace.api.errors import APIError
from headrace.api.schemas import error_responses
from headrace.api.state import app_state
from headrace.gateway.access import Scope
from headrace.gateway.auth import key_from_headers
from headrace.gateway.reload import ReloadResult
from headrace.ledger.records import key_id

_INVALID = "invalid_request_error"
_NOTHING = "nothing to reload: this app has no tenants file"
router = APIRouter(tags=["internal"], responses=error_responses(400, 401, 404, 409))


@router.post("/admin/reload")
async def reload(request: Request) -> dict[str, Any]:
    state = app_state(request)
    state.gateway.access.authorize(Scope.ADMIN, request.headers)
    reloader = state.reloader
    result = reloader.reload() if reloader is not None else ReloadResult(409, _NOTHING)
    audit_reload(state, key_id(key_from_headers(request.headers)), "POST /admin/reload", result)
    if not result.ok:
        code = "invalid_tenants_file" if result.status == 400 else None
        raise APIError(result.status, result.message, type=_INVALID, code=code)
    return {"reloaded": True, "message": result.message, **result.summary}
