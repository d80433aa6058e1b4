"""Who may see the dashboard, in process (httpx.ASGITransport, a stand-in engine): the rule of
/v1/stats — open on an open server, the admin key (bearer, x-api-key or a Basic password) on a
guarded one, and a 401 that makes a browser ask for it."""

from __future__ import annotations

import base64

import httpx
import pytest
from fake_engine import FakeEngine
from fastapi import FastAPI

from api.inprocess import make_app, request, session
from api.route_coverage import covers
from headrace.api.dashboard import STATIC
from headrace.gateway.access import InternalAccess
from headrace.gateway.auth import KeyStore, hash_key
from headrace.gateway.base import OpenGateway

ADMIN = "admin-secret"
PATHS = (
    "/dashboard", "/dashboard/data", "/dashboard/ledger",
    *(f"/dashboard/static/{name}" for name in STATIC),
)  # fmt: skip


def basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"authorization": f"Basic {token}"}


def app_with(access: InternalAccess) -> FastAPI:
    return make_app(FakeEngine(), OpenGateway(access=access))


def statuses(access: InternalAccess, headers: dict[str, str]) -> dict[str, int]:
    async def go(c: httpx.AsyncClient) -> dict[str, int]:
        return {path: (await c.get(path, headers=headers)).status_code for path in PATHS}

    return session(app_with(access), go)


GUARDED = InternalAccess(KeyStore([(hash_key(ADMIN), "admin")]))


@covers(
    "GET /dashboard", "GET /dashboard/data", "GET /dashboard/ledger", "GET /dashboard/static/{name}"
)
@pytest.mark.parametrize(
    "headers",
    [
        {"authorization": f"Bearer {ADMIN}"},
        {"x-api-key": ADMIN},
        basic("admin", ADMIN),
        basic("", ADMIN),
    ],
)
def test_the_admin_key_opens_every_dashboard_path(headers: dict[str, str]) -> None:
    assert set(statuses(GUARDED, headers).values()) == {200}


@covers(
    "GET /dashboard", "GET /dashboard/data", "GET /dashboard/ledger", "GET /dashboard/static/{name}"
)
@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"authorization": "Bearer wrong"},
        basic("admin", "wrong"),
        basic(ADMIN, ""),  # the key as the user name is not the password
        {"authorization": "Basic not-base64!"},
    ],
)
def test_without_the_admin_key_every_dashboard_path_is_401(headers: dict[str, str]) -> None:
    assert set(statuses(GUARDED, headers).values()) == {401}


@covers(
    "GET /dashboard", "GET /dashboard/data", "GET /dashboard/ledger", "GET /dashboard/static/{name}"
)
def test_a_tenants_file_without_an_admin_key_locks_the_dashboard() -> None:
    locked = InternalAccess(tenants=True)
    assert set(statuses(locked, {"authorization": "Bearer anything"}).values()) == {401}


@covers(
    "GET /dashboard", "GET /dashboard/data", "GET /dashboard/ledger", "GET /dashboard/static/{name}"
)
def test_an_open_server_shows_it_to_anyone() -> None:
    assert set(statuses(InternalAccess(), {}).values()) == {200}


@covers("GET /dashboard/data")
def test_the_401_asks_a_browser_for_the_key_and_leaks_nothing() -> None:
    r = request(app_with(GUARDED), "GET", "/dashboard/data")
    assert r.status_code == 401
    assert r.headers["www-authenticate"].startswith("Basic realm=")
    assert r.json()["error"]["type"] == "authentication_error"
    assert "models" not in r.text


@covers("GET /dashboard/static/{name}")
def test_unknown_static_file_is_404_and_paths_do_not_escape() -> None:
    async def go(c: httpx.AsyncClient) -> list[int]:
        paths = ("/dashboard/static/nope.js", "/dashboard/static/..%2f__init__.py")
        return [(await c.get(p)).status_code for p in paths]

    assert session(app_with(InternalAccess()), go) == [404, 404]


@covers("GET /dashboard/data")
def test_data_takes_the_slo_targets_and_refuses_bad_ones() -> None:
    async def go(c: httpx.AsyncClient) -> list[httpx.Response]:
        queries = ("ttft_ms=250&tpot_ms=40", "", "ttft_ms=0", "tpot_ms=abc")
        return [await c.get(f"/dashboard/data?{q}") for q in queries]

    chosen, default, zero, word = session(app_with(InternalAccess()), go)
    assert chosen.status_code == 200 and chosen.json()["slo"] == {"ttft_s": 0.25, "tpot_s": 0.04}
    assert default.json()["slo"] == {"ttft_s": 1.0, "tpot_s": 0.1}
    assert zero.status_code == 400 and word.status_code == 400
    body = default.json()
    assert body["status"] == "ok"
    assert body["models"]["m"]["healthy"] is True and body["models"]["m"]["replicas"] == []
    assert body["models"]["m"]["step"]["kv_blocks_total"] == 0
    assert body["requests"]["all"]["requests"] == 0
    assert default.headers["cache-control"] == "no-store"
