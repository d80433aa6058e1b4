"""The replica route keeps a slow stream alive with SSE comments, and a front end's
`RemoteEngine` reads through them (in process: the app over a fake engine, httpx's ASGI
transport in between)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fake_engine import FakeEngine

from headrace.api import replica_api
from headrace.api.app import build_app
from headrace.config import ServerConfig
from headrace.engine.frontend.client import GenerateOptions, GenerationChunk
from headrace.gateway.access import InternalAccess
from headrace.gateway.base import OpenGateway
from headrace.request import FinishReason, SamplingParams
from headrace.router.remote import RemoteEngine

GAP_S = 0.3  # between the fake engine's chunks; keep-alives go out every 0.05 s meanwhile


class Vocab:
    vocab_size = 100


class SlowEngine(FakeEngine):
    tokenizer = Vocab()

    async def stream(
        self, request_id: str, prompt: list[int], params: SamplingParams,
        options: GenerateOptions | None,
    ) -> AsyncIterator[GenerationChunk]:  # fmt: skip
        for i, reason in enumerate((None, FinishReason.LENGTH)):
            await asyncio.sleep(GAP_S)  # waiting in a queue, then a slow step
            yield GenerationChunk(request_id, f"t{i}", [i + 3], reason, completion_tokens=i + 1)


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> httpx.AsyncClient:
    monkeypatch.setattr(replica_api, "KEEPALIVE_S", 0.05)
    gateway = OpenGateway(access=InternalAccess(replica_api=True))
    app = build_app({"m": SlowEngine()}, gateway, ServerConfig())
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://replica")


def body() -> dict[str, Any]:
    return {"request_id": "r1", "model": "m", "prompt_token_ids": [1, 2],
            "params": {"max_tokens": 2}, "options": {}}  # fmt: skip


def test_keep_alives_before_the_first_chunk_and_between_chunks(client: httpx.AsyncClient) -> None:
    async def read() -> tuple[int, list[str]]:
        async with client:
            r = await client.post("/v1/replica/generate", json=body())
            return r.status_code, [line for line in r.text.split("\n") if line]

    status, lines = asyncio.run(read())
    assert status == 200
    data = [i for i, line in enumerate(lines) if line.startswith("data: {")]
    assert len(data) == 2 and lines[-1] == "data: [DONE]"
    assert ": keep-alive" in lines[: data[0]], "nothing went out while the request waited"
    assert ": keep-alive" in lines[data[0] : data[1]], "nothing went out between chunks"


def test_the_front_end_reads_through_keep_alives(client: httpx.AsyncClient) -> None:
    async def read() -> list[GenerationChunk]:
        remote = RemoteEngine(client, "m", 64, Vocab(), read_timeout_s=GAP_S * 3)
        try:
            return [c async for c in remote.generate("r1", [1, 2], SamplingParams(max_tokens=2))]
        finally:
            await client.aclose()

    chunks = asyncio.run(read())
    assert [c.text for c in chunks] == ["t0", "t1"] and chunks[-1].finish_reason == "length"
