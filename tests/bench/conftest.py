"""A stub OpenAI-compatible server with a known capacity, served by uvicorn on 127.0.0.1.

It is the tests' own ASGI app, not a stand-in for Headrace: `slots` requests stream at a time,
one token every `token_delay` seconds, the others wait their turn. So one stub serves at most
`slots / (max_tokens * token_delay)` requests/s; above that its queue, and with it TTFT, grows.
It counts the tokens it sends and, unless `metrics=False`, exports them with queue depth and a
KV-usage figure at /metrics under Headrace's metric names.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route


@dataclass
class StubServer:
    slots: int = 4
    token_delay: float = 0.005
    fail_status: int | None = None  # answer every generation request with this error
    max_waiting: int | None = None  # 429 + Retry-After beyond this queue depth
    metrics: bool = True
    running: int = 0
    waiting: int = 0
    generated: int = 0
    requests: int = 0
    keys: Counter[str] = field(default_factory=Counter)
    _sem: asyncio.Semaphore | None = None

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/completions", self.completions, methods=["POST"]),
                Route("/v1/generate", self.generate, methods=["POST"]),
                Route("/v1/models", self.models),
                Route("/metrics", self.export_metrics),
            ]
        )

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "stub-model", "object": "model"}]})

    async def completions(self, request: Request) -> Response:
        return await self._serve(request, "completions")

    async def generate(self, request: Request) -> Response:
        return await self._serve(request, "generate")

    async def _serve(self, request: Request, api: str) -> Response:
        body = await request.json()
        self.requests += 1
        self.keys[request.headers.get("authorization", "").removeprefix("Bearer ")] += 1
        if self.fail_status is not None:
            return _error(self.fail_status, "server_error", "the stub is told to fail")
        full = self.running >= self.slots
        if self.max_waiting is not None and full and self.waiting >= self.max_waiting:
            return _error(429, "rate_limit_error", "queue full", {"Retry-After": "1"})
        tokens = int(body.get("max_tokens", 16))
        return StreamingResponse(self._stream(tokens, api), media_type="text/event-stream")

    async def _stream(self, tokens: int, api: str) -> AsyncIterator[str]:
        if self._sem is None:
            self._sem = asyncio.Semaphore(self.slots)
        self.waiting += 1
        try:
            await self._sem.acquire()
        finally:
            self.waiting -= 1
        self.running += 1
        try:
            for i in range(tokens):
                await asyncio.sleep(self.token_delay)
                self.generated += 1
                text = f" w{i}"
                event = {"text": text} if api == "generate" else {"choices": [{"text": text}]}
                yield f"data: {json.dumps(event)}\n\n"
            usage = {"prompt_tokens": 3, "completion_tokens": tokens}
            final = {"finish_reason": "length", "usage": usage}
            if api == "completions":
                final = {"choices": [], "usage": usage}
            yield f"data: {json.dumps(final)}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            self.running -= 1
            self._sem.release()

    async def export_metrics(self, request: Request) -> Response:
        if not self.metrics:
            return PlainTextResponse("not found", status_code=404)
        label = '{model_name="stub-model"}'
        lines = [
            "# TYPE headrace:num_requests_running gauge",
            f"headrace:num_requests_running{label} {self.running}",
            "# TYPE headrace:num_requests_waiting gauge",
            f"headrace:num_requests_waiting{label} {self.waiting}",
            "# TYPE headrace:kv_cache_usage_perc gauge",
            f"headrace:kv_cache_usage_perc{label} {self.running / self.slots}",
            "# TYPE headrace:generation_tokens counter",
            f"headrace:generation_tokens_total{label} {self.generated}",
        ]
        return PlainTextResponse("\n".join(lines) + "\n")


def _error(status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> Response:
    body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
    return JSONResponse(body, status_code=status, headers=headers)


@contextmanager
def serve(app: Starlette) -> Iterator[str]:
    """Serve `app` with uvicorn in a thread on a free 127.0.0.1 port; yields the base URL."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "stub server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


StubFactory = Callable[..., tuple[str, StubServer]]


@pytest.fixture
def stub_server() -> Iterator[StubFactory]:
    """`start(**settings) -> (url, stub)`: starts stub servers, stops them after the test."""
    with ExitStack() as stack:

        def start(**settings: Any) -> tuple[str, StubServer]:
            stub = StubServer(**settings)
            return stack.enter_context(serve(stub.app())), stub

        yield start
