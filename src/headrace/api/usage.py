"""The ledger's answers: `GET /v1/usage` (a caller's own totals; the admin key's holder sees
every tenant's and may pick one) and `GET /v1/audit` (the admin actions, behind the admin key).

Both read what the requests before them wrote: the ledger flushes first. 404 on a server
without a ledger (`--no-ledger`); 400 with the parameter named for a bad time or grouping; 503
while the ledger's file cannot be read.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from fastapi import APIRouter, Request

from headrace.api.errors import APIError, bad_request
from headrace.api.schemas import error_responses
from headrace.api.state import AppState, app_state
from headrace.gateway.access import Scope
from headrace.ledger.database import database_errors
from headrace.ledger.query import QueryError, UsageQuery, parse_time
from headrace.ledger.writer import Ledger

router = APIRouter(tags=["usage"], responses=error_responses(400, 401, 403, 404, 503))
_SUMMED = (
    "requests", "prompt_tokens", "cached_tokens", "completion_tokens", "total_tokens",
    "recomputed_tokens", "draft_tokens", "accepted_tokens", "errors",
)  # fmt: skip
MAX_AUDIT_LIMIT = 10_000

log = logging.getLogger("headrace.ledger")
_READS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="ledger-read")


@router.get("/v1/usage")
async def usage(
    request: Request,
    start: str | None = None,
    end: str | None = None,
    group_by: str | None = None,
    tenant: str | None = None,
) -> dict[str, Any]:
    state = app_state(request)
    ledger = _ledger(state)
    if not state.gateway.access.allows(Scope.STATS, request.headers):  # a tenant: its own
        own = state.gateway.authenticate(request.headers).name
        if tenant is not None and tenant != own:
            raise APIError(403, "a tenant sees only its own usage", param="tenant")
        tenant = own
    try:
        query = UsageQuery(parse_time("start", start), parse_time("end", end), tenant, group_by)
    except QueryError as e:
        raise bad_request(str(e), e.param) from e
    rows = await _read(ledger.totals, query)
    return {
        "object": "usage", "start": query.start, "end": query.end, "tenant": tenant,
        "group_by": group_by, "data": rows,
        "totals": {k: sum(int(r[k]) for r in rows) for k in _SUMMED},
    }  # fmt: skip


@router.get("/v1/audit")
async def audit_log(
    request: Request, start: str | None = None, end: str | None = None, limit: int = 100
) -> dict[str, Any]:
    state = app_state(request)
    state.gateway.access.authorize(Scope.ADMIN, request.headers)
    ledger = _ledger(state)
    if not 1 <= limit <= MAX_AUDIT_LIMIT:
        raise bad_request(f"limit must be in 1..{MAX_AUDIT_LIMIT}", "limit")
    try:
        since, until = parse_time("start", start), parse_time("end", end)
    except QueryError as e:
        raise bad_request(str(e), e.param) from e
    rows = await _read(ledger.audit, since, until, limit)
    return {"object": "list", "data": rows}


async def _read(work: Callable[..., list[dict[str, Any]]], *args: Any) -> list[dict[str, Any]]:
    """`work(*args)` off the event loop; a ledger that cannot be read now is a 503."""
    try:  # its own two threads: a hung database never takes the pool prompts tokenize in
        return await asyncio.get_running_loop().run_in_executor(_READS, partial(work, *args))
    except database_errors() as e:  # the detail (a host, a port) is the operator's: the log
        log.warning("the ledger cannot be read: %s", e)
        raise APIError(503, "the ledger cannot be read now", type="unavailable_error") from e


def _ledger(state: AppState) -> Ledger:
    if state.ledger is None:
        raise APIError(404, "this server keeps no ledger (it was started with --no-ledger)")
    return state.ledger
