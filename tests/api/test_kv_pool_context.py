"""A server whose KV pool holds fewer tokens than the model's context serves the pool's
context: `/v1/models` says so, a chat without `max_tokens` gets the rest of it (not a refusal
of a limit the caller never set), and a request past it is a 400 naming the limit, streamed or
not, with nothing held afterwards (the tenant's one concurrent slot is free again). Real
`headrace serve`, tiny model, 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from factories import Server, make_tiny_llama, serving, tiny_server_args, write_tenants

from headrace.gateway.auth import hash_key

POOL = 8 * 16  # --num-kv-blocks 8 --block-size 16: fewer than the tiny model's 512
TENANTS = f"""
tenants:
  solo: {{tier: paid, api_key_sha256: [{hash_key("solo-key")}], max_concurrent: 1}}
"""
AUTH = {"authorization": "Bearer solo-key"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp: Path = tmp_path_factory.mktemp("kvpool")
    args = tiny_server_args(make_tiny_llama(tmp / "tiny")) + [
        "--num-kv-blocks", "8", "--tenants", str(write_tenants(tmp, TENANTS)),
    ]  # fmt: skip
    yield from serving(args, tmp)


@pytest.fixture
def client(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=60) as c:
        yield c


def test_models_report_the_pools_context(server: Server, client: httpx.Client) -> None:
    models = client.get("/v1/models").json()["data"]
    assert [m["max_model_len"] for m in models] == [POOL]
    assert f"the KV pool holds {POOL} tokens, fewer than max_model_len 512" in server.log()


def test_chat_without_max_tokens_fills_the_pools_context(client: httpx.Client) -> None:
    body = {
        "model": "tiny", "messages": [{"role": "user", "content": "w5 w6 w7"}],
        "ignore_eos": True,
    }  # fmt: skip
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert usage["total_tokens"] == POOL
    assert r.json()["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("stream", [False, True])
def test_past_the_pool_is_a_400_and_holds_nothing(client: httpx.Client, stream: bool) -> None:
    body = {"model": "tiny", "prompt": "w5 w6", "max_tokens": POOL, "stream": stream}
    for _ in range(3):  # a leaked concurrency slot would turn the next ones into 429s
        r = client.post("/v1/completions", json=body)
        assert r.status_code == 400, r.text
        assert r.headers["content-type"].startswith("application/json")
        error = r.json()["error"]
        assert f"maximum context length is {POOL} tokens" in error["message"]
        assert error["param"] == "max_tokens"
    ok = client.post("/v1/completions", json={**body, "max_tokens": 4, "stream": False})
    assert ok.status_code == 200, ok.text
    assert ok.json()["usage"]["completion_tokens"] == 4
