"""`POST /admin/reload` in process: behind the admin key, 200 with what changed, 400 with the
start-up message for a bad file (the old tenants stay), 409 with nothing to reload (the
real-server side, SIGHUP included: tests/gateway/test_reload_server.py)."""

from __future__ import annotations

from pathlib import Path

import httpx
from fake_engine import FakeEngine
from fastapi import FastAPI
from gateway.conftest import tenants_yaml

from api.inprocess import make_app, session
from api.route_coverage import covers
from headrace.gateway.gateway import TenantGateway
from headrace.gateway.reload import GatewayReloader

AS_ADMIN = {"authorization": "Bearer admin-key"}  # its digest is in tenants_yaml()


def reloading_app(path: Path, reloader: bool = True) -> tuple[TenantGateway, FastAPI]:
    path.write_text(tenants_yaml())
    gateway = TenantGateway.from_file(path)
    app = make_app(FakeEngine(), gateway)
    app.state.headrace.reloader = GatewayReloader(gateway, str(path), None) if reloader else None
    return gateway, app


@covers("POST /admin/reload")
def test_reload_swaps_keys_behind_the_admin_key(tmp_path: Path) -> None:
    path = tmp_path / "tenants.yaml"
    gateway, app = reloading_app(path)

    async def work(c: httpx.AsyncClient) -> list[httpx.Response]:
        out = [await c.post("/admin/reload")]  # no key
        out.append(await c.post("/admin/reload", headers={"authorization": "Bearer bob-key"}))
        path.write_text(tenants_yaml(**{"bob:": "robert:"}))
        out.append(await c.post("/admin/reload", headers=AS_ADMIN))
        out.append(await c.get("/v1/models", headers={"authorization": "Bearer bob-key"}))
        return out

    no_key, tenant, ok, models = session(app, work)
    assert no_key.status_code == 401 and tenant.status_code == 401, (no_key.text, tenant.text)
    assert ok.status_code == 200, ok.text
    body = ok.json()
    assert body["reloaded"] is True
    assert (body["tenants_added"], body["tenants_removed"]) == (["robert"], ["bob"])
    assert "robert" in gateway.tenants and "bob" not in gateway.tenants
    assert models.status_code == 200  # the key stayed, now robert's


@covers("POST /admin/reload")
def test_a_bad_file_is_a_400_and_the_old_tenants_stay(tmp_path: Path) -> None:
    path = tmp_path / "tenants.yaml"
    gateway, app = reloading_app(path)
    path.write_text(tenants_yaml(**{"max_concurrent: 2": "max_concurrent: -5"}))

    async def work(c: httpx.AsyncClient) -> httpx.Response:
        return await c.post("/admin/reload", headers=AS_ADMIN)

    r = session(app, work)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_tenants_file" and "max_concurrent" in error["message"]
    assert "bob" in gateway.tenants  # unchanged


@covers("POST /admin/reload")
def test_nothing_to_reload_is_a_409(tmp_path: Path) -> None:
    _, app = reloading_app(tmp_path / "tenants.yaml", reloader=False)

    async def work(c: httpx.AsyncClient) -> httpx.Response:
        return await c.post("/admin/reload", headers=AS_ADMIN)

    r = session(app, work)
    assert r.status_code == 409 and r.headers["content-type"] == "application/json", r.text
