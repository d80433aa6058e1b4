"""A batch line as a request to this server's own route, in process: the same validation,
admission, sampling, usage and ledger record as the HTTP request with that body, but with no
socket and no key — the line runs as its owner's batch-tier self, set in the ASGI scope (where
no HTTP client can reach: a client sets headers, never scope keys).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from typing import Any

from starlette.types import ASGIApp, Message

from headrace.api.errors import error_body
from headrace.batches.runner import Execute
from headrace.gateway.base import Gateway, Tenant
from headrace.gateway.gateway import TenantGateway
from headrace.gateway.tenants import DEFAULT_TIERS, Tier

log = logging.getLogger("headrace.batches")
TENANT_KEY = "headrace.tenant"  # the scope keys `admit` takes the caller from
KEY_ID_KEY = "headrace.key_id"
ROUTE_KEY = "headrace.route"  # the ledger's route for a batch line: batch:/v1/completions


def in_process(app: ASGIApp, gateway: Gateway) -> Execute:
    """`execute(tenant, key_id, url, body) -> (status, JSON body)` through `app`'s route for
    `url`, as `tenant` on the batch tier (`key_id`: the batch's creator, for the ledger)."""

    async def execute(
        tenant_name: str, key_id: str | None, url: str, body: dict[str, Any]
    ) -> tuple[int, Any]:
        tenant = batch_tenant(gateway, tenant_name)
        if tenant is None:  # removed from the tenants file since the batch was made
            return 403, error_body(f"tenant {tenant_name!r} no longer exists", "permission_error")
        scope = {TENANT_KEY: tenant, KEY_ID_KEY: key_id, ROUTE_KEY: f"batch:{url}"}
        status, payload = await call(app, url, json.dumps(body).encode(), scope)
        try:
            return status, json.loads(payload)
        except ValueError:
            return status, error_body(payload.decode(errors="replace"), "server_error")

    return execute


def batch_tenant(gateway: Gateway, name: str) -> Tenant | None:
    """The tenant `name` on the batch tier: never more urgent than the tier, its limits its own."""
    tiers: dict[str, Tier] = dict(DEFAULT_TIERS)
    if isinstance(gateway, TenantGateway) and gateway.config is not None:
        tiers.update(gateway.config.tiers)
        tenant = gateway.tenants.get(name)
    else:
        tenant = gateway.authenticate({})  # an open server: everyone is its one tenant
    if tenant is None:
        return None
    tier = tiers["batch"]
    return dataclasses.replace(
        tenant, tier="batch", priority=max(tenant.priority, tier.priority),
        queue_timeout_s=tier.queue_timeout_s,
    )  # fmt: skip


async def call(app: ASGIApp, path: str, body: bytes, extra: dict[str, Any]) -> tuple[int, bytes]:
    """POST `body` (JSON) to `path` on `app`; its status and body. Cancelling it is the
    client hanging up: the route aborts its engine request."""
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "client": None, "server": ("batch", 0),
        "headers": [(b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()), (b"host", b"localhost")],
        **extra,
    }  # fmt: skip
    answered = asyncio.Event()
    sent = False
    status = 500
    chunks: list[bytes] = []

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await answered.wait()  # no disconnect before the answer: there is no client to leave
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                answered.set()

    try:
        await app(scope, receive, send)
    except Exception as e:  # starlette re-raises a route's crash after answering it (500)
        log.error("a batch line to %s failed", path, exc_info=e)
        if not answered.is_set():
            return 500, json.dumps(error_body(f"the server failed: {e}", "server_error")).encode()
    return status, b"".join(chunks)
