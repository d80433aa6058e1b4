"""Who may use the internal routes: the one rule, in one place.

The internal routes are what a front end or an operator uses, never a tenant:
`/v1/replica/*` (run a request as any tenant, at any priority, past every limit), `/v1/stats`
and `/metrics` (every model's and tenant's traffic), the details of `/health` (process ids,
replica URLs), `/admin/*` (reload the tenants file) and, with `--api-docs`, `/openapi.json`
(every route, the internal ones too). The rule:

- **Guarded** (a tenants file, or an admin key, is set): all of them need the admin key. With a
  tenants file but no admin key configured at all they are refused (401) with a message telling
  the operator to set `--admin-key` or `admin_key_sha256`. `/health` still answers its status.
- **Open** (neither): `/v1/stats`, `/metrics` and `/health` are open, as is everything else;
  `/v1/replica/*` is off (404) unless `--replica-api` turns it on, open to anyone; `/admin/*`
  is off (404).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from headrace.gateway.auth import KeyStore, key_from_headers
from headrace.gateway.errors import GatewayError, unauthenticated


class Scope(enum.StrEnum):
    REPLICA = "replica"  # /v1/replica/*
    STATS = "stats"  # /v1/stats
    METRICS = "metrics"  # /metrics
    HEALTH = "health"  # the details of /health (its status is for everyone)
    ADMIN = "admin"  # /admin/* (reload)
    DOCS = "docs"  # /openapi.json, when --api-docs serves it


class InternalAccess:
    def __init__(
        self,
        admin_keys: KeyStore | None = None,
        *,
        tenants: bool = False,
        replica_api: bool = False,
    ) -> None:
        self.admin_keys = admin_keys or KeyStore(())
        self.tenants = tenants  # a tenants file is loaded: tenants' traffic is private
        self.replica_api = replica_api  # --replica-api: the open server serves /v1/replica/*

    @property
    def guarded(self) -> bool:
        return self.tenants or len(self.admin_keys) > 0

    @property
    def replica_api_open(self) -> bool:
        """The replica routes answer anyone (the operator should hear about it at start)."""
        return self.replica_api and not self.guarded

    @property
    def locked_out(self) -> bool:
        """Guarded, but no key can pass: the operator has to set one."""
        return self.guarded and len(self.admin_keys) == 0

    def authorize(self, scope: Scope, headers: Mapping[str, str]) -> None:
        """Raises GatewayError: 401 without the admin key where one is needed, 404 for the
        replica routes of an open server without `--replica-api`."""
        if not self.guarded:
            if scope is Scope.ADMIN:  # nothing to administer: no tenants file, no admin key
                raise GatewayError(
                    404, "not_found_error",
                    "the admin routes are off on this server: start it with --tenants or an "
                    "admin key (--admin-key-file)",
                )  # fmt: skip
            if scope is Scope.REPLICA and not self.replica_api:
                raise GatewayError(
                    404, "not_found_error",
                    "the replica API is off on this server: start it with --replica-api, or "
                    "with --admin-key to serve it to holders of that key only",
                )  # fmt: skip
            return
        if self.locked_out:
            raise unauthenticated(
                f"{_PATHS[scope]} needs the admin key, and this server has none: start it with "
                "--admin-key-file FILE (or --admin-key, HEADRACE_ADMIN_KEY) or set "
                "admin_key_sha256 in the tenants file"
            )
        if self.admin_keys.owner(key_from_headers(headers)) is None:
            raise unauthenticated(f"{_PATHS[scope]} needs the admin key")

    def allows(self, scope: Scope, headers: Mapping[str, str]) -> bool:
        try:
            self.authorize(scope, headers)
        except GatewayError:
            return False
        return True


_PATHS = {
    Scope.REPLICA: "/v1/replica/*",
    Scope.STATS: "/v1/stats",
    Scope.METRICS: "/metrics",
    Scope.HEALTH: "the details of /health",
    Scope.ADMIN: "/admin/*",
    Scope.DOCS: "/openapi.json",
}
