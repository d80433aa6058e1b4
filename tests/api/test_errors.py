"""Every refusal is a JSON error in OpenAI's shape with the right status, before any work."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from factories import MAX_MODEL_LEN, Server, read_metrics

CHAT = [{"role": "user", "content": "hi"}]
OVER_CONTEXT = MAX_MODEL_LEN + 10

# (route, body, status, param): body is a dict (sent as JSON) or bytes (sent raw)
CASES: list[tuple[str, Any, int, str | None]] = [
    ("/v1/generate", b'{"prompt": "hi", "max_tokens": ', 400, None),
    ("/v1/completions", b"not json at all", 400, None),
    ("/v1/chat/completions", b"[1, 2", 400, None),
    ("/v1/generate", {"prompt": "hi", "max_tokens": "5"}, 400, "max_tokens"),
    ("/v1/generate", {"prompt": 42}, 400, "prompt"),
    ("/v1/completions", {"prompt": "hi", "temperature": "hot"}, 400, "temperature"),
    ("/v1/chat/completions", {"messages": "hi"}, 400, "messages"),
    ("/v1/generate", {"max_tokens": 4}, 400, "prompt"),
    ("/v1/completions", {"max_tokens": 4}, 400, "prompt"),
    ("/v1/chat/completions", {"max_tokens": 4}, 400, "messages"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("/v1/generate", {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": -3}, 400, "max_tokens"),
    ("/v1/generate", {"prompt": "hi", "max_tokens": 10**12}, 400, "max_tokens"),
    ("/v1/generate", {"prompt": "hi", "max_tokens": OVER_CONTEXT}, 400, "max_tokens"),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": OVER_CONTEXT}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "fox " * MAX_MODEL_LEN, "stream": True}, 400, "prompt"),
    ("/v1/generate", {"prompt": "hi", "temperature": -0.5}, 400, "temperature"),
    ("/v1/generate", {"prompt": "hi", "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {"prompt": "hi", "top_p": 1.5}, 400, "top_p"),
    ("/v1/generate", {"prompt": "hi", "model": "gpt-9"}, 404, "model"),
    ("/v1/chat/completions", {"messages": CHAT, "model": "gpt-9", "stream": True}, 404, "model"),
    ("/v1/completions", {"prompt": "hi", "n": 17}, 400, "n"),
    ("/v1/chat/completions", {"messages": CHAT, "n": 0}, 400, "n"),
    ("/v1/completions", {"prompt": [1, 2, 10**6]}, 400, "prompt"),
    ("/v1/generate", {"prompt": "hi", "max_token": 5}, 400, "max_token"),
    ("/v1/generate", {"prompt": "hi", "stop": ""}, 400, "stop"),
    ("/v1/generate", {"prompt": "hi", "timeout": -1}, 400, "timeout"),
    ("/v1/generate", b'{"prompt": "hi", "temperature": NaN}', 400, "temperature"),
    ("/v1/generate", {"prompt": "x" * 1_100_000}, 413, None),
]


def _check_shape(r: httpx.Response, status: int, param: str | None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]
    if param is not None:
        assert error["param"] is not None and error["param"].startswith(param), error
    return dict(error)


@pytest.mark.parametrize(("route", "body", "status", "param"), CASES)
def test_bad_request_gets_json_error(
    client: httpx.Client, route: str, body: Any, status: int, param: str | None
) -> None:
    if isinstance(body, bytes):
        r = client.post(route, content=body, headers={"content-type": "application/json"})
    else:
        r = client.post(route, json=body)
    _check_shape(r, status, param)


def test_context_error_states_the_limits(client: httpx.Client) -> None:
    r = client.post("/v1/generate", json={"prompt": "hello there", "max_tokens": OVER_CONTEXT})
    message = _check_shape(r, 400, "max_tokens")["message"]
    assert str(MAX_MODEL_LEN) in message and str(OVER_CONTEXT) in message


def test_refusals_do_no_engine_work(client: httpx.Client, api_server: Server) -> None:
    before = read_metrics(api_server.url).get("headrace:prompt_tokens_total", 0.0)
    for route, body, _, _ in CASES:
        if isinstance(body, dict):
            client.post(route, json=body)
    assert read_metrics(api_server.url).get("headrace:prompt_tokens_total", 0.0) == before


@pytest.mark.parametrize(
    ("method", "path", "status"), [("GET", "/v1/nothing", 404), ("GET", "/v1/generate", 405)]
)
def test_unknown_routes_get_json_errors(
    client: httpx.Client, method: str, path: str, status: int
) -> None:
    _check_shape(client.request(method, path), status, None)
