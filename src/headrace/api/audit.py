"""Admin actions into the ledger's audit log: who (the admin key's id), what, the arguments
(secrets redacted) and the outcome. A server without a ledger logs them only."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from headrace.api.state import AppState
from headrace.gateway.reload import ReloadResult
from headrace.ledger.records import AuditEntry, redact


def audit(
    state: AppState,
    action: str,
    key_id: str | None,
    arguments: Mapping[str, Any],
    status: int,
    result: Mapping[str, Any],
) -> None:
    if state.ledger is not None:
        state.ledger.append(AuditEntry(action, key_id, redact(arguments), status, dict(result)))


def audit_reload(state: AppState, key_id: str | None, via: str, result: ReloadResult) -> None:
    """A tenants reload (POST /admin/reload, or SIGHUP with no key), as it went."""
    outcome = {"message": result.message, **result.summary}
    audit(state, "tenants.reload", key_id, {"via": via}, result.status, outcome)
