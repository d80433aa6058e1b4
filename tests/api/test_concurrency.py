"""Many clients at once: no cross-talk between streams, and clients that leave free everything."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
from factories import Server, read_metrics, sse_events

PROMPTS = [f"Prompt number {i}: the quick brown fox {'jumps ' * (i % 5)}" for i in range(16)]


async def _stream_text(client: httpx.AsyncClient, body: dict[str, object]) -> str:
    async with client.stream("POST", "/v1/generate", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        events = sse_events([line async for line in r.aiter_lines()])
    assert events[-1] == "[DONE]"
    return "".join(json.loads(e)["text"] for e in events[:-1])


def test_concurrent_greedy_streams_each_get_their_solo_output(
    client: httpx.Client, api_server: Server
) -> None:
    bodies = [
        {"prompt": p, "max_tokens": 32, "temperature": 0, "ignore_eos": True} for p in PROMPTS
    ]
    solo = [client.post("/v1/generate", json=b).json()["text"] for b in bodies]
    assert len(set(solo)) > 1, "prompts should lead to different outputs"

    async def run() -> tuple[list[str], list[int]]:
        async with httpx.AsyncClient(base_url=api_server.url, timeout=60) as c:
            streams = asyncio.gather(*(_stream_text(c, b) for b in bodies))
            health = []
            for _ in range(5):  # /health keeps answering while the engine is busy
                health.append((await c.get("/health")).status_code)
                await asyncio.sleep(0.05)
            return await streams, health

    together, health = asyncio.run(run())
    assert together == solo
    assert health == [200] * 5


def _aborts(url: str) -> float:
    return read_metrics(url).get(
        'headrace:request_success_total{finish_reason="abort",model_name="tiny"}', 0.0
    )


def _ended(url: str) -> float:
    """Requests that reached the engine and ended, for any reason."""
    return read_metrics(url).get("headrace:request_success_total", 0.0)


def test_clients_that_leave_are_aborted_and_free_their_kv_blocks(
    client: httpx.Client, api_server: Server
) -> None:
    aborts_before = _aborts(api_server.url)
    ended_before = _ended(api_server.url)
    long = {"max_tokens": 480, "temperature": 0, "ignore_eos": True}

    async def leave_mid_stream(i: int) -> int:
        async with httpx.AsyncClient(base_url=api_server.url, timeout=60) as c:
            body = {**long, "prompt": PROMPTS[i % 16], "stream": True}
            async with c.stream("POST", "/v1/generate", json=body) as r:
                seen = 0
                async for line in r.aiter_lines():
                    seen += line.startswith("data: ")
                    if seen >= 3:
                        return seen  # closing the response drops the connection
        return seen

    async def leave_while_waiting(i: int) -> bool:
        """True if it left before its answer came (the answer of a fast step may not wait)."""
        async with httpx.AsyncClient(base_url=api_server.url, timeout=60) as c:
            try:
                await asyncio.wait_for(
                    c.post("/v1/generate", json={**long, "prompt": PROMPTS[i]}), 0.25
                )
            except TimeoutError:
                return True
        return False

    gone: list[bool] = []

    async def run() -> None:
        results = await asyncio.gather(
            *(leave_mid_stream(i) for i in range(20)), *(leave_while_waiting(i) for i in range(5))
        )
        assert results[:20] == [3] * 20
        gone.extend(bool(x) for x in results[20:])
        assert any(gone), "every 480-token request finished within 0.25 s: this proves nothing"

    asyncio.run(run())
    left = time.monotonic()
    deadline = left + 2.0
    while True:
        m = read_metrics(api_server.url)
        idle = (
            m["headrace:num_requests_running"] == 0
            and m["headrace:num_requests_waiting"] == 0
            and m["headrace:kv_cache_used_blocks"] == 0
        )
        if idle or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert idle, {k: v for k, v in m.items() if "num_requests" in k or "kv_cache" in k}
    # A client that gives up within 0.25 s may leave before the server has read its request:
    # then nothing reached the engine and there is nothing to abort. Every other one that left is.
    never_admitted = 25 - (_ended(api_server.url) - ended_before)
    assert 0 <= never_admitted <= sum(gone)
    assert _aborts(api_server.url) - aborts_before == 20 + sum(gone) - never_admitted
    r = client.post("/v1/generate", json={"prompt": "still there?", "max_tokens": 4})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
