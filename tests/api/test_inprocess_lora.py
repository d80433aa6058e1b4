"""The LoRA admin routes in process: behind the admin key, vLLM's bodies, a refused load a
400 with the core's reason (nothing listed), unknown names 404, /v1/models following along,
every call in the audit log (the real core behind them: tests/lora/test_lora_server.py)."""

from __future__ import annotations

from pathlib import Path

import httpx
from fake_engine import FakeEngine
from gateway.conftest import tenants_yaml

from api.inprocess import make_app, session
from api.route_coverage import covers
from headrace.gateway.gateway import TenantGateway
from headrace.ledger.writer import Ledger

ADMIN = {"authorization": "Bearer admin-key"}
BOB = {"authorization": "Bearer bob-key"}
LOAD, UNLOAD = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"


class LoraEngine(FakeEngine):
    """Holds adapters by name; a path ending in `bad` is refused as the core would."""

    def __init__(self) -> None:
        self.loaded: dict[str, str] = {}

    async def lora_command(self, name: str, path: str | None) -> None:
        if path is None:
            if self.loaded.pop(name, None) is None:
                raise ValueError(f"adapter {name!r} is not loaded")
        elif path.endswith("bad"):
            raise ValueError(f"{path}/adapter_config.json: rank 128 is above --max-lora-rank 64")
        else:
            self.loaded[name] = path


@covers("POST /v1/load_lora_adapter", "POST /v1/unload_lora_adapter")
def test_load_and_unload_behind_the_admin_key(tmp_path: Path) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text(tenants_yaml(**{"tier: free\n": 'tier: free\n    adapters: "*"\n'}))
    engine = LoraEngine()
    ledger = Ledger(tmp_path / "ledger.db", flush_s=60)
    app = make_app(engine, TenantGateway.from_file(path), ledger=ledger)
    body = {"lora_name": "support", "lora_path": "/adapters/support"}

    async def work(c: httpx.AsyncClient) -> dict[str, httpx.Response]:
        out = {"no key": await c.post(LOAD, json=body)}
        out["tenant"] = await c.post(LOAD, json=body, headers=BOB)
        out["bad"] = await c.post(LOAD, json={**body, "lora_path": "/x/bad"}, headers=ADMIN)
        out["typo"] = await c.post(LOAD, json={**body, "lora_nme": "x"}, headers=ADMIN)
        out["name"] = await c.post(LOAD, json={**body, "lora_name": "no spaces"}, headers=ADMIN)
        out["ok"] = await c.post(LOAD, json=body, headers=ADMIN)
        out["again"] = await c.post(LOAD, json=body, headers=ADMIN)
        out["base name"] = await c.post(LOAD, json={**body, "lora_name": "m"}, headers=ADMIN)
        out["listed"] = await c.get("/v1/models", headers=BOB)
        out["unknown"] = await c.post(UNLOAD, json={"lora_name": "legal"}, headers=ADMIN)
        out["unload"] = await c.post(
            UNLOAD, json={"lora_name": "support", "lora_int_id": 1}, headers=ADMIN
        )
        out["gone"] = await c.get("/v1/models", headers=BOB)
        out["audit"] = await c.get("/v1/audit", headers=ADMIN)
        return out

    r = session(app, work)
    assert r["no key"].status_code == 401 and r["tenant"].status_code == 401
    assert r["bad"].status_code == 400
    assert "rank 128 is above --max-lora-rank" in r["bad"].json()["error"]["message"]
    assert r["typo"].status_code == 400 and r["name"].status_code == 400
    assert r["ok"].status_code == 200, r["ok"].text
    assert r["ok"].json() == {
        "object": "lora_adapter", "id": "support", "parent": "m", "loaded": True
    }  # fmt: skip
    assert r["again"].status_code == 400 and "already served" in r["again"].text
    assert r["base name"].status_code == 400
    models = {m["id"]: m["parent"] for m in r["listed"].json()["data"]}
    assert models == {"m": None, "support": "m"}
    assert r["unknown"].status_code == 404
    assert r["unknown"].json()["error"]["code"] == "lora_not_found"
    assert r["unload"].status_code == 200, r["unload"].text
    assert [m["id"] for m in r["gone"].json()["data"]] == ["m"]
    assert engine.loaded == {}
    audited = [(e["action"], e["status"]) for e in r["audit"].json()["data"]]
    assert sorted(audited) == sorted(
        [("lora.load", 400)] * 4 + [("lora.load", 200), ("lora.unload", 404), ("lora.unload", 200)]
    ), audited  # the two with no or a tenant's key never reached the route's work


@covers("POST /v1/load_lora_adapter")
def test_admin_routes_are_off_on_an_open_server() -> None:
    app = make_app(LoraEngine())

    async def work(c: httpx.AsyncClient) -> httpx.Response:
        return await c.post(LOAD, json={"lora_name": "a", "lora_path": "/a"})

    assert session(app, work).status_code == 404
