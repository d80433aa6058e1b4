"""Hostile text and fields a client may send: always a JSON 4xx naming the field, never a 5xx,
and the server keeps serving. Bodies are sent as raw bytes because a lone surrogate cannot be
encoded by a JSON library's UTF-8 writer (that is the point: the server must not try either)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from factories import Server, read_metrics

CHAT = [{"role": "user", "content": "hi"}]

SURROGATES: list[tuple[str, bytes, str]] = [
    ("/v1/generate", b'{"prompt": "a\\ud800b", "max_tokens": 2}', "prompt"),
    ("/v1/completions", b'{"prompt": "\\ud800", "max_tokens": 2}', "prompt"),
    ("/v1/completions", b'{"prompt": ["x\\udfff"], "max_tokens": 2}', "prompt"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\ud800"}]}', "messages"),
    (
        "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udbff"}]}]}',
        "messages",
    ),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "name": "\\ud800"}]}', "messages"),
    ("/v1/generate", b'{"prompt": "hi", "stop": ["\\ud800"]}', "stop"),
    ("/v1/completions", b'{"prompt": "hi", "model": "\\ud800"}', "model"),
    ("/v1/generate", b'{"prompt": "hi", "\\ud800": 1}', ""),  # an echoed bad key
    ("/v1/completions", b'{"prompt": "hi", "\\ud800x": 1}', ""),
]

UNSUPPORTED: list[tuple[str, str, Any]] = [
    ("/v1/completions", "best_of", 3),
    ("/v1/completions", "length_penalty", 0.5),
    ("/v1/completions", "echo", True),
    ("/v1/completions", "suffix", "end"),
    ("/v1/chat/completions", "functions", [{"name": "f"}]),  # tools' deprecated form
    ("/v1/chat/completions", "function_call", {"name": "f"}),
    ("/v1/chat/completions", "some_unknown_field", 1),
    ("/v1/completions", "some_unknown_field", "x"),
]

# What OpenAI's and vLLM's clients send as defaults: must still pass.
DEFAULTS: dict[str, Any] = {
    "presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": None, "user": "u-1",
    "response_format": {"type": "text"}, "tools": None, "tool_choice": "none",
    "parallel_tool_calls": True, "metadata": {"a": "b"}, "store": False, "n": 1,
}  # fmt: skip


def _post_raw(client: httpx.Client, route: str, body: bytes) -> httpx.Response:
    return client.post(route, content=body, headers={"content-type": "application/json"})


def _error(r: httpx.Response) -> dict[str, Any]:
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json")
    error: dict[str, Any] = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


@pytest.mark.parametrize(("route", "body", "param"), SURROGATES)
def test_lone_surrogates_are_a_400(
    client: httpx.Client, route: str, body: bytes, param: str
) -> None:
    r = _post_raw(client, route, body)
    assert r.status_code == 400, r.text
    error = _error(r)
    if param:
        assert (error["param"] or "").startswith(param), error


@pytest.mark.parametrize(("route", "field", "value"), UNSUPPORTED)
def test_unsupported_fields_are_refused_by_name(
    client: httpx.Client, route: str, field: str, value: Any
) -> None:
    base: dict[str, Any] = {"prompt": "hi"} if route == "/v1/completions" else {"messages": CHAT}
    r = client.post(route, json={**base, "max_tokens": 2, field: value})
    assert r.status_code == 400, r.text
    error = _error(r)
    assert error["param"] == field and field in error["message"]


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_default_values_of_unsupported_fields_pass(client: httpx.Client, route: str) -> None:
    base: dict[str, Any] = {"prompt": "hi"} if route == "/v1/completions" else {"messages": CHAT}
    chat_only = ("response_format", "tools", "tool_choice", "parallel_tool_calls")
    chat = route.endswith("chat/completions")
    extra = {k: v for k, v in DEFAULTS.items() if chat or k not in chat_only}
    r = client.post(route, json={**base, "max_tokens": 2, **extra})
    assert r.status_code == 200, r.text


def test_stop_token_ids_end_the_output(client: httpx.Client, api_model_dir: Path) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(api_model_dir / "tokenizer.json"))
    by_text: dict[str, list[int]] = {}
    for i in range(tok.get_vocab_size()):
        by_text.setdefault(tok.decode([i]), []).append(i)
    body = {"prompt": "The quick brown fox", "max_tokens": 12, "temperature": 0,
            "ignore_eos": True, "logprobs": 0}  # fmt: skip
    free = client.post("/v1/completions", json=body).json()["choices"][0]
    tokens = free["logprobs"]["tokens"]
    assert len(tokens) == 12
    # The first token whose text names one id, and that did not come earlier.
    unique = [len(by_text.get(t, [])) == 1 and t not in tokens[:k] for k, t in enumerate(tokens)]
    k = unique.index(True)
    stopped = client.post(
        "/v1/completions", json={**body, "stop_token_ids": by_text[tokens[k]]}
    ).json()
    choice = stopped["choices"][0]
    assert choice["finish_reason"] == "stop", stopped
    assert stopped["usage"]["completion_tokens"] == k + 1
    assert free["text"].startswith(choice["text"])


def test_server_is_healthy_after_hostile_text(client: httpx.Client, api_server: Server) -> None:
    for route, body, _ in SURROGATES:
        _post_raw(client, route, body)
    assert client.get("/health").status_code == 200
    r = client.post("/v1/generate", json={"prompt": "hello", "max_tokens": 3})
    assert r.status_code == 200, r.text
    metrics = read_metrics(api_server.url)
    assert metrics["headrace:num_requests_running"] == 0.0
    assert metrics["headrace:kv_cache_used_blocks"] == 0.0
