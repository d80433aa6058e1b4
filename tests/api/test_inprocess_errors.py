"""Error mapping in process: what an engine's failure becomes on each generation route (status,
OpenAI's error body, an error event mid-stream), and every refusal of test_errors.py and
test_input_edges.py — same status, same field named — with the engine never asked."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from fake_engine import text_chunks

from api.inprocess import connect, events, make_app, request, script_engine
from api.route_coverage import covers
from api.test_errors import CASES, OVER_CONTEXT
from api.test_input_edges import SURROGATES, UNSUPPORTED
from headrace.request import FinishReason

GENERATE, COMPLETIONS, CHAT = "/v1/generate", "/v1/completions", "/v1/chat/completions"
ROUTES = [GENERATE, COMPLETIONS, CHAT]
ALL = "POST /v1/generate", "POST /v1/completions", "POST /v1/chat/completions"
CHAT_MESSAGES = [{"role": "user", "content": "hi"}]


def body(route: str, **fields: Any) -> dict[str, Any]:
    return {"messages" if route == CHAT else "prompt": CHAT_MESSAGES if route == CHAT else "hi",
            **fields}  # fmt: skip


def error_of(r: httpx.Response, status: int) -> dict[str, Any]:
    """OpenAI's error body, checked for shape."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    error: dict[str, Any] = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


ERROR_CHUNK = text_chunks([], FinishReason.ERROR, error="replica m/0 exited")
OVERLOADED_CHUNK = text_chunks([], FinishReason.OVERLOADED, error="not started in 2 s")
# (script, status, type, code, message) of an engine outcome before any text
OUTCOMES = [
    (ERROR_CHUNK, 502, "server_error", 502, "replica m/0 exited"),
    (OVERLOADED_CHUNK, 503, "overloaded_error", 503, "not started in 2 s"),
    ([ValueError("the prompt can never fit: 600 tokens, 512 blocks")], 400,
     "invalid_request_error", None, "the prompt can never fit: 600 tokens, 512 blocks"),
    ([RuntimeError("core died")], 503, "unavailable_error", None, "the engine failed: core died"),
    ([], 500, "server_error", None, "the engine ended the request without a result"),
]  # fmt: skip


@covers(*ALL)
@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("script", "status", "kind", "code", "message"), OUTCOMES)
def test_an_engine_outcome_before_any_text_is_a_json_error(
    route: str, stream: bool, script: list[Any], status: int, kind: str, code: int | None,
    message: str,
) -> None:  # fmt: skip
    engine = script_engine(script)
    r = request(engine, "POST", route, json=body(route, stream=stream))
    error = error_of(r, status)
    assert (error["type"], error["code"], error["message"]) == (kind, code, message)
    if status == 503:  # every 503 says when to come back
        assert r.headers["retry-after"] == "1"
    assert engine.closed == [engine.requests[0].request_id]  # the engine request was freed


@covers(*ALL)
@pytest.mark.parametrize("route", ROUTES)
def test_a_failure_after_text_ends_the_stream_with_an_error_event(route: str) -> None:
    script = text_chunks(["Hello", " there"], FinishReason.ERROR, error="replica m/0 exited")
    got = events(request(script_engine(script), "POST", route, json=body(route, stream=True)))
    assert got[-1] == {"error": {"message": "replica m/0 exited", "type": "server_error",
                                 "param": None, "code": 502}}  # fmt: skip
    assert any("Hello" in str(e) for e in got[:-1])  # what came before was sent
    whole = request(script_engine(script), "POST", route, json=body(route))
    assert error_of(whole, 502)["message"] == "replica m/0 exited"


@covers("POST /v1/generate")
def test_a_stream_open_at_shutdown_ends_with_an_error_event() -> None:
    engine = script_engine([text_chunks(["Hello", " there"])[0], 30.0])  # then a long wait
    app = make_app(engine)

    async def go() -> httpx.Response:
        async with connect(app) as client:
            asyncio.get_running_loop().call_later(0.2, app.state.headrace.shutdown.set)
            return await client.post(GENERATE, json=body(GENERATE, stream=True))

    got = events(asyncio.run(go()))
    assert got[0]["text"] == "Hello"
    assert got[-1]["error"]["message"] == "server shutting down" and got[-1]["error"]["code"] == 503
    assert engine.aborted == [engine.requests[0].request_id]  # the engine stops working on it


@covers(*ALL)
@pytest.mark.parametrize("route", ROUTES)
def test_an_unhealthy_or_stopping_engine_is_a_503_and_an_unknown_model_a_404(route: str) -> None:
    engine = script_engine()
    engine.healthy = False
    error = error_of(request(engine, "POST", route, json=body(route)), 503)
    assert error["message"] == "the engine of model 'm' is not running"
    assert error["type"] == "unavailable_error"
    engine.healthy = True
    app = make_app(engine)
    app.state.headrace.shutdown.set()
    assert error_of(request(app, "POST", route, json=body(route)), 503)["message"] == (
        "server shutting down"
    )
    error = error_of(request(engine, "POST", route, json=body(route, model="gpt-9")), 404)
    assert (error["param"], error["code"]) == ("model", "model_not_found")
    assert "served: m" in error["message"] and not engine.requests


@covers(*ALL)
@pytest.mark.parametrize(("route", "payload", "status", "param"), CASES)
def test_a_bad_request_is_refused_as_on_a_real_server(
    route: str, payload: Any, status: int, param: str | None
) -> None:
    engine = script_engine()
    if isinstance(payload, bytes):
        headers = {"content-type": "application/json"}
        r = request(engine, "POST", route, content=payload, headers=headers)
    else:
        r = request(engine, "POST", route, json=payload)
    error = error_of(r, status)
    if param is not None:
        assert error["param"] is not None and error["param"].startswith(param), error
    assert not engine.requests  # refused before any engine work


@covers("POST /v1/generate")
def test_the_context_error_states_the_limits() -> None:
    engine = script_engine()
    r = request(engine, "POST", GENERATE, json=body(GENERATE, max_tokens=OVER_CONTEXT))
    message = error_of(r, 400)["message"]
    assert "512" in message and str(OVER_CONTEXT) in message


@covers(*ALL)
@pytest.mark.parametrize(("route", "payload", "param"), SURROGATES)
def test_lone_surrogates_are_a_400_naming_the_field(route: str, payload: bytes, param: str) -> None:
    engine = script_engine()
    headers = {"content-type": "application/json"}
    error = error_of(request(engine, "POST", route, content=payload, headers=headers), 400)
    assert (error["param"] or "").startswith(param), error
    assert not engine.requests


@covers("POST /v1/completions", "POST /v1/chat/completions")
@pytest.mark.parametrize(("route", "field", "value"), UNSUPPORTED)
def test_unsupported_fields_are_refused_by_name(route: str, field: str, value: Any) -> None:
    engine = script_engine()
    r = request(engine, "POST", route, json=body(route, max_tokens=2, **{field: value}))
    error = error_of(r, 400)
    assert error["param"] == field and field in error["message"]
    assert not engine.requests


@pytest.mark.parametrize(
    ("method", "path", "status"), [("GET", "/v1/nothing", 404), ("GET", GENERATE, 405)]
)
def test_unknown_routes_and_methods_get_json_errors(method: str, path: str, status: int) -> None:
    error = error_of(request(script_engine(), method, path), status)
    assert error["code"] == status
