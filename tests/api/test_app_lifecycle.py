"""The app in-process (httpx.ASGITransport): loading states and limits that need no model."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping

import httpx

from headrace.api.app import build_app
from headrace.config import ServerConfig
from headrace.engine.frontend.client import EngineClient
from headrace.gateway.base import OpenGateway


def test_health_is_503_while_loading_and_after_a_failed_load() -> None:
    release = asyncio.Event()

    async def loader() -> Mapping[str, EngineClient]:
        await release.wait()
        raise RuntimeError("no such weights")

    app = build_app({}, OpenGateway(), ServerConfig(), loader=loader)

    async def run() -> None:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
                r = await c.get("/health")
                assert (r.status_code, r.json()["status"]) == (503, "loading")
                r = await c.post("/v1/generate", json={"prompt": "hi"})
                assert r.status_code == 503 and r.json()["error"]["message"] == "model is loading"
                release.set()
                for _ in range(100):
                    await asyncio.sleep(0.01)
                    r = await c.get("/health")
                    if r.json()["status"] != "loading":
                        break
                assert r.status_code == 503
                assert r.json() == {"status": "failed", "error": "no such weights"}
                assert (await c.get("/metrics")).status_code == 200

    asyncio.run(run())


def test_chunked_body_over_the_limit_is_413_before_it_is_all_read() -> None:
    app = build_app({}, OpenGateway(), ServerConfig(max_body_bytes=1000))
    sent = 0

    async def body() -> AsyncIterator[bytes]:
        nonlocal sent
        yield b'{"prompt": "'
        for _ in range(100):  # 10 kB in all, no Content-Length
            sent += 100
            yield b"x" * 100
        yield b'"}'

    async def run() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            return await c.post("/v1/generate", content=body())

    r = asyncio.run(run())
    assert r.status_code == 413
    assert r.json()["error"]["code"] == 413 and "1000 bytes" in r.json()["error"]["message"]
    assert sent < 10_000
