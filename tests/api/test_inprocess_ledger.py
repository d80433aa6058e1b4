"""The ledger's routes and records in process (the real-server side: tests/ledger/): an engine
failure and a refusal are recorded with their status; a ledger that cannot be written fails no
request and counts what it drops; without a ledger the routes say so (404)."""

from __future__ import annotations

from pathlib import Path

import httpx
from fake_engine import ScriptEngine
from gateway.conftest import tenants_yaml

from api.inprocess import make_app, script_engine, session
from api.route_coverage import covers
from headrace.engine.frontend.client import GenerationChunk
from headrace.gateway.gateway import TenantGateway
from headrace.ledger.writer import Ledger
from headrace.request import FinishReason

ACME = {"authorization": "Bearer acme-key"}
ADMIN = {"authorization": "Bearer admin-key"}  # digests in tenants_yaml()
BODY = {"model": "m", "prompt": "Hi", "max_tokens": 4}


def gateway(tmp_path: Path) -> TenantGateway:
    path = tmp_path / "tenants.yaml"
    path.write_text(tenants_yaml())
    return TenantGateway.from_file(path)


def metric(text: str, name: str) -> float:
    line = next(x for x in text.splitlines() if x.startswith(name + " "))
    return float(line.split()[-1])


@covers("GET /v1/usage", "GET /v1/audit")
def test_failures_and_refusals_are_recorded_with_their_status(tmp_path: Path) -> None:
    def script(request: object) -> list[GenerationChunk | BaseException | float]:
        return [GenerationChunk("", "", [], FinishReason.ERROR, 3, error="replica died")]

    ledger = Ledger(tmp_path / "l.db", flush_s=60)
    app = make_app(script_engine(script), gateway(tmp_path), ledger=ledger)

    async def work(c: httpx.AsyncClient) -> list[httpx.Response]:
        out = [await c.post("/v1/completions", json=BODY, headers=ACME)]
        out.append(await c.post("/v1/completions", json={**BODY, "model": "x"}, headers=ACME))
        out.append(await c.get("/v1/usage", headers=ACME))
        out.append(await c.get("/v1/audit", headers=ADMIN))
        out.append(await c.get("/v1/usage", params={"start": "later"}, headers=ACME))
        return out

    failed, unknown_model, usage, audit, bad = session(app, work)
    assert (failed.status_code, unknown_model.status_code) == (502, 404)
    totals = usage.json()["totals"]
    assert (totals["requests"], totals["errors"], totals["prompt_tokens"]) == (2, 2, 3)
    assert audit.status_code == 200 and audit.json()["data"] == []
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "start"


@covers("GET /v1/usage")
def test_an_unwritable_ledger_fails_no_request_and_counts_what_it_drops(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    ledger = Ledger(blocker / "ledger.db", flush_s=60, max_pending=2)
    app = make_app(script_engine(), ledger=ledger)

    async def work(c: httpx.AsyncClient) -> list[httpx.Response]:
        out = [await c.post("/v1/completions", json=BODY) for _ in range(5)]
        out.append(await c.get("/v1/usage"))  # the read fails: 503, not a crash
        out.append(await c.get("/metrics"))
        return out

    *answers, usage, metrics = session(app, work)
    assert [r.status_code for r in answers] == [200] * 5
    assert usage.status_code == 503 and "cannot be read" in usage.json()["error"]["message"]
    assert metric(metrics.text, "headrace:ledger_records_dropped_total") == 3
    assert metric(metrics.text, "headrace:ledger_write_errors_total") >= 1
    assert metric(metrics.text, "headrace:ledger_records_pending") == 2


@covers("GET /v1/usage", "GET /v1/audit")
def test_without_a_ledger_its_routes_say_so(tmp_path: Path) -> None:
    app = make_app(ScriptEngine([]), gateway(tmp_path))

    async def work(c: httpx.AsyncClient) -> list[httpx.Response]:
        return [await c.get("/v1/usage", headers=ACME), await c.get("/v1/audit", headers=ADMIN)]

    for r in session(app, work):
        assert r.status_code == 404 and "--no-ledger" in r.json()["error"]["message"]


def test_a_callers_odd_model_name_neither_reaches_nor_blocks_the_ledger(tmp_path: Path) -> None:
    """An unknown model's 404 is recorded without the caller's name for it: a NUL (which
    PostgreSQL refuses, holding up every batch after it) or a megabyte of text stays out."""
    ledger = Ledger(tmp_path / "l.db", flush_s=60)
    app = make_app(script_engine(lambda r: []), gateway(tmp_path), ledger=ledger)

    async def work(c: httpx.AsyncClient) -> list[httpx.Response]:
        out = []
        for name in ("x\u0000y", "m" * 200_000):
            out.append(await c.post("/v1/completions", json={**BODY, "model": name}, headers=ACME))
        out.append(await c.get("/v1/usage", params={"group_by": "model"}, headers=ACME))
        return out

    nul, huge, usage = session(app, work)
    assert (nul.status_code, huge.status_code) == (404, 404)
    rows = usage.json()["data"]
    assert [(r["model"], r["requests"]) for r in rows] == [(None, 2)]
