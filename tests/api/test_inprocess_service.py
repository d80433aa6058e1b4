"""The service routes in process: /health, /metrics, /v1/models, /v1/stats and the schema pages,
open and behind an admin key (the real-server side: test_internal_routes.py, test_errors.py)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fake_engine import FakeEngine

from api.inprocess import make_app, request, script_engine, session
from api.route_coverage import covers
from headrace.config import ServerConfig
from headrace.engine.messages import StepStats
from headrace.gateway.access import InternalAccess
from headrace.gateway.auth import KeyStore, hash_key
from headrace.gateway.base import OpenGateway

ADMIN = "admin-secret"
GUARDED = OpenGateway(access=InternalAccess(KeyStore([(hash_key(ADMIN), "admin")])))
AS_ADMIN = {"authorization": f"Bearer {ADMIN}"}


class RoutedEngine(FakeEngine):
    """A router as the routes see one: live stats and its replicas described."""

    max_model_len = 256

    def stats(self) -> StepStats:
        return StepStats(num_running=3, num_waiting=1, kv_blocks_used=5, kv_blocks_total=20)

    def describe(self) -> dict[str, Any]:
        return {"replicas": [{"name": "m/0", "state": "healthy", "pid": 4242}]}


@covers("GET /health")
def test_health_is_ok_with_every_engine_up_and_503_with_one_down() -> None:
    engines = {"a": script_engine(), "b": script_engine()}
    r = request(make_app(engines), "GET", "/health")
    assert (r.status_code, r.json()) == (200, {"status": "ok", "models": {"a": "ok", "b": "ok"}})
    engines["b"].healthy = False
    r = request(make_app(engines), "GET", "/health")
    assert r.status_code == 503 and r.headers["content-type"] == "application/json"
    assert r.json() == {"status": "unhealthy", "models": {"a": "ok", "b": "dead"}}


@covers("GET /health")
def test_health_details_are_for_the_admin_on_a_guarded_server() -> None:
    r = request(make_app(RoutedEngine()), "GET", "/health")
    assert r.json()["replicas"] == {"m": [{"name": "m/0", "state": "healthy", "pid": 4242}]}
    for headers in ({}, {"authorization": "Bearer wrong"}):
        r = request(make_app(RoutedEngine(), GUARDED), "GET", "/health", headers=headers)
        assert (r.status_code, r.json()) == (200, {"status": "ok"})
    r = request(make_app(RoutedEngine(), GUARDED), "GET", "/health", headers=AS_ADMIN)
    assert r.json()["replicas"]["m"][0]["pid"] == 4242


def metric(text: str, name: str) -> float:
    """The sum of a series over its label sets."""
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
        if line.split("{", 1)[0].split(" ", 1)[0] == name
    )  # fmt: skip


@covers("GET /metrics", "POST /v1/generate")
def test_metrics_count_what_was_served() -> None:
    engine = script_engine()
    app = make_app(engine)

    async def serve_one(client: httpx.AsyncClient) -> httpx.Response:
        before = await client.get("/metrics")
        assert metric(before.text, "headrace:prompt_tokens_total") == 0
        answer = await client.post("/v1/generate", json={"prompt": "Hello world"})
        assert answer.status_code == 200, answer.text
        return await client.get("/metrics")

    r = session(app, serve_one)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    prompt = len(engine.requests[0].prompt_token_ids)
    assert metric(r.text, "headrace:prompt_tokens_total") == prompt
    assert metric(r.text, "headrace:generation_tokens_total") == 2
    assert metric(r.text, "headrace:request_success_total") == 1
    assert 'headrace:num_requests_running{model_name="m"}' in r.text


@covers("GET /metrics", "GET /v1/stats")
@pytest.mark.parametrize("path", ["/metrics", "/v1/stats"])
def test_internal_routes_need_the_admin_key_on_a_guarded_server(path: str) -> None:
    for headers in ({}, {"authorization": "Bearer wrong"}):
        r = request(make_app(RoutedEngine(), GUARDED), "GET", path, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        assert "needs the admin key" in r.json()["error"]["message"]
    assert request(make_app(RoutedEngine(), GUARDED), "GET", path, headers=AS_ADMIN).is_success
    locked = OpenGateway(access=InternalAccess(tenants=True))  # guarded, and no key can pass
    r = request(make_app(RoutedEngine(), locked), "GET", path, headers=AS_ADMIN)
    assert r.status_code == 401 and "--admin-key" in r.json()["error"]["message"]


@covers("GET /v1/models")
def test_models_lists_every_served_model_with_its_context() -> None:
    app = make_app({"tiny": script_engine(), "big": RoutedEngine()})
    answer = request(app, "GET", "/v1/models").json()
    assert answer["object"] == "list"
    assert [(m["id"], m["max_model_len"]) for m in answer["data"]] == [("tiny", 512), ("big", 256)]
    for card in answer["data"]:
        assert card["object"] == "model" and card["owned_by"] == "headrace"
        assert isinstance(card["created"], int)


@covers("GET /v1/stats")
def test_stats_give_each_models_live_load_and_replicas() -> None:
    app = make_app({"m": RoutedEngine(), "solo": script_engine()})
    answer = request(app, "GET", "/v1/stats").json()
    assert answer["loading"] is False
    m = answer["models"]["m"]
    assert (m["max_model_len"], m["healthy"], m["prefix_cache_hit_rate"]) == (256, True, 0)
    assert m["stats"]["num_running"] == 3 and m["stats"]["kv_blocks_total"] == 20
    assert m["replicas"][0]["name"] == "m/0"
    assert "replicas" not in answer["models"]["solo"]  # a lone engine has none


DOC_PAGES = ("/docs", "/docs/oauth2-redirect", "/redoc")  # they load Swagger UI from a CDN


def pages(config: ServerConfig, gateway: OpenGateway | None = None,
          headers: dict[str, str] | None = None) -> dict[str, httpx.Response]:  # fmt: skip
    async def fetch(client: httpx.AsyncClient) -> dict[str, httpx.Response]:
        paths = ("/openapi.json", *DOC_PAGES)
        return {path: await client.get(path, headers=headers) for path in paths}

    return session(make_app(script_engine(), gateway, config), fetch)


def test_neither_the_schema_nor_its_pages_are_served_by_default() -> None:
    assert {p: r.status_code for p, r in pages(ServerConfig()).items()} == {
        "/openapi.json": 404, "/docs": 404, "/docs/oauth2-redirect": 404, "/redoc": 404,
    }  # fmt: skip


@covers("GET /openapi.json")
def test_api_docs_serve_the_schema_and_no_page_that_loads_off_machine_assets() -> None:
    served = pages(ServerConfig(api_docs=True))
    assert {p: served[p].status_code for p in DOC_PAGES} == dict.fromkeys(DOC_PAGES, 404)
    assert served["/openapi.json"].status_code == 200
    schema = served["/openapi.json"].json()
    assert {"/v1/generate", "/v1/completions", "/v1/chat/completions", "/v1/models", "/health",
            "/v1/stats", "/v1/replica/generate"} <= set(schema["paths"])  # fmt: skip
    responses = [op["responses"] for ops in schema["paths"].values() for op in ops.values()]
    assert not any("422" in r for r in responses)  # validation errors are answered with 400


@covers("GET /openapi.json")
@pytest.mark.parametrize(("headers", "status"), [({}, 401), ({"x-api-key": ADMIN}, 200)])
def test_the_schema_of_a_guarded_server_needs_the_admin_key(
    headers: dict[str, str], status: int
) -> None:
    r = pages(ServerConfig(api_docs=True), GUARDED, headers)["/openapi.json"]
    assert r.status_code == status, r.text
