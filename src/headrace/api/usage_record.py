"""A finished request as the ledger records it: its tokens (all `n` choices), the engine's
counts, its timing and outcome. Called once per HTTP request that reached the engine, when its
run closes; and for a known tenant's request refused before it (`record_refusal`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from fastapi import Request

from headrace.api.job import FinishedRun
from headrace.api.outcomes import ABORTED, status_of
from headrace.gateway.auth import key_from_headers
from headrace.gateway.base import Tenant
from headrace.ledger.records import UsageRecord, key_id

if TYPE_CHECKING:
    from headrace.api.state import AppState

log = logging.getLogger("headrace.ledger")


def record_usage(state: AppState, runs: Sequence[FinishedRun], n: int = 1) -> None:
    """One record for a request's runs (its choices; the first holds the prompt). Called from
    the runs' cleanup: whatever goes wrong here is logged, never raised into it."""
    if state.ledger is None:
        return
    try:
        state.ledger.append(_usage(runs, n))
    except Exception:
        log.exception("the ledger's record of %s was not made", runs[0].job.request_id)


def _usage(runs: Sequence[FinishedRun], n: int) -> UsageRecord:
    first = runs[0]
    job, timer = first.job, first.job.timer
    counts = [r.last for r in runs if r.last is not None]
    return UsageRecord(
        tenant=job.admission.tenant.name, model=job.base or job.model, adapter=job.adapter,
        route=job.route,
        http_status=http_status(runs), request_id=job.request_id, key_id=job.key_id,
        prompt_tokens=first.prompt_tokens, cached_tokens=first.cached_tokens,
        completion_tokens=sum(r.completion_tokens for r in runs),
        recomputed_tokens=sum(c.recomputed_tokens for c in counts),
        draft_tokens=sum(c.draft_tokens for c in counts),
        accepted_tokens=sum(c.accepted_tokens for c in counts),
        n=n, queue_s=timer.queue_time, ttft_s=timer.ttft, total_s=timer.e2e,
        finish_reason=first.reason, replica=first.replica, resumed=any(c.resumed for c in counts),
    )  # fmt: skip


def http_status(runs: Sequence[FinishedRun]) -> int:
    """The first error a run ended with; else 499 if one was cut short (the client left or the
    server stopped: nginx's code), else 200."""
    for run in runs:
        status = status_of(run.finish_reason, run.http_status)
        if status is not None:
            return status
    return ABORTED if any(r.finish_reason is None for r in runs) else 200


def ledger_names(request: Request) -> tuple[str | None, str]:
    """The caller's key id and the route, as the ledger records them; a batch line's are set
    in its scope (`batch_call`: the batch's creator, `batch:` and the line's url)."""
    route = request.scope.get("headrace.route")
    if isinstance(route, str):
        return request.scope.get("headrace.key_id"), route
    return key_id(key_from_headers(request.headers)), request.url.path


def record_refusal(
    state: AppState, request: Request, tenant: Tenant, asked: str | None, status: int
) -> None:
    """A known tenant's request refused before it reached an engine (400, 404, 429, 503).
    The model it `asked` for is kept only where it is served to this tenant (a base model, or
    an adapter it may use, as its base and itself): a caller's made-up names stay out of the
    ledger, and another tenant's adapter is recorded as a name nobody serves."""
    if state.ledger is None:
        return
    who, route = ledger_names(request)
    base = state.visible_adapters(tenant).get(asked) if asked is not None else None
    adapter = asked if base is not None else None
    model = base if base is not None else asked if asked in state.engines else None
    record = UsageRecord(tenant.name, model, route, status, adapter=adapter, key_id=who)
    state.ledger.append(record)
