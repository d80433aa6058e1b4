"""Reloading the tenants file (and the admin key file) without a restart: SIGHUP or
`POST /admin/reload`.

The new file is validated in full first; a bad one is refused with the message a start would
give, and the gateway keeps the old one. A good one is swapped in at once, on the event loop
(between requests: the gateway's methods are synchronous): keys added and revoked, tiers and
limits changed, for the next request. Requests in flight keep the tenant and the reservation
they were admitted with, and finish normally.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from headrace.gateway.admin_key import AdminKeyError, AdminKeySource
from headrace.gateway.base import Gateway
from headrace.gateway.gateway import TenantGateway
from headrace.gateway.tenants import TenantsConfig, TenantsFileError, load_tenants

log = logging.getLogger("headrace.gateway")


@dataclass(frozen=True)
class ReloadResult:
    status: int  # 200 reloaded, 400 refused (bad file), 409 nothing to reload
    message: str
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == 200


class GatewayReloader:
    def __init__(
        self, gateway: Gateway, tenants: str | None, admin_key: AdminKeySource | None
    ) -> None:
        self.gateway = gateway
        self.tenants = tenants  # the file given with --tenants
        self.admin_key = admin_key

    def reload(self) -> ReloadResult:
        """Reload, log what happened, and say it (the admin route answers with it)."""
        gateway = self.gateway
        reloadable = self.tenants is not None or (self.admin_key and self.admin_key.reloadable)
        if not isinstance(gateway, TenantGateway) or not reloadable:
            result = ReloadResult(
                409, "nothing to reload: the server was started without --tenants or "
                "--admin-key-file",
            )  # fmt: skip
            log.warning("reload: %s", result.message)
            return result
        try:
            config = load_tenants(self.tenants) if self.tenants is not None else None
            admin = [self.admin_key.read()] if self.admin_key is not None else []
        except (TenantsFileError, AdminKeyError) as e:
            log.error("reload refused, the old tenants and keys stay: %s", e)
            return ReloadResult(400, str(e))
        summary = _summary(gateway.config, config)
        gateway.reload(config, admin)
        summary["admin_keys"] = len(gateway.admin_keys)
        message = _describe(summary)
        log.warning("reloaded: %s", message)  # at warning: servers run with --log-level warning
        if gateway.access.locked_out:
            log.warning("after the reload no admin key is set: the internal routes refuse all")
        return ReloadResult(200, message, summary)


def _summary(old: TenantsConfig | None, new: TenantsConfig | None) -> dict[str, Any]:
    """Which tenants and keys came, went or changed (names and counts, never keys)."""
    before = {s.name: s for s in old.tenants} if old is not None else {}
    after = {s.name: s for s in new.tenants} if new is not None else {}
    old_keys = {h for s in before.values() for h in s.key_hashes}
    new_keys = {h for s in after.values() for h in s.key_hashes}
    return {
        "source": new.source if new is not None else None,
        "tenants": len(after),
        "tenants_added": sorted(after.keys() - before.keys()),
        "tenants_removed": sorted(before.keys() - after.keys()),
        "tenants_changed": sorted(n for n in after.keys() & before.keys() if after[n] != before[n]),
        "keys_added": len(new_keys - old_keys),
        "keys_revoked": len(old_keys - new_keys),
    }


def _describe(s: dict[str, Any]) -> str:
    parts = [f"{s['source'] or 'the admin key file'}: {s['tenants']} tenants"]
    for what in ("added", "removed", "changed"):
        if names := s[f"tenants_{what}"]:
            parts.append(f"{what} {', '.join(names)}")
    parts.append(f"{s['keys_added']} keys added, {s['keys_revoked']} revoked")
    parts.append(f"{s['admin_keys']} admin keys")
    return "; ".join(parts)
