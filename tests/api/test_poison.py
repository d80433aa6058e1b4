"""A request that makes the model step raise fails alone: the streams sharing its steps finish
with their usual text, its KV blocks come back, and the engine core is never restarted.

The server runs with `HEADRACE_FAULT_POISON_TOKEN`: a step computing that token id raises.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from factories import Server, read_metrics, serving, stream_text, tiny_server_args

POISON = 300
GOOD = [
    {
        "prompt": f"Prompt number {i}: the quick brown fox {'jumps ' * (i % 3)}",
        "max_tokens": 64, "temperature": 0, "ignore_eos": True, "stream": True,
    }
    for i in range(8)
]  # fmt: skip


@pytest.fixture(scope="module")
def poisoned_server(
    api_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    env = {"HEADRACE_FAULT_POISON_TOKEN": str(POISON)}
    yield from serving(tiny_server_args(api_model_dir), tmp_path_factory.mktemp("logs"), env)


async def _run(url: str, poisoned: dict[str, object] | None) -> tuple[list[str], httpx.Response]:
    async with httpx.AsyncClient(base_url=url, timeout=60) as c:
        started = [asyncio.Event() for _ in GOOD]
        streams = asyncio.gather(
            *(stream_text(c, b, e) for b, e in zip(GOOD, started, strict=True))
        )
        # Every good stream is decoding when the poisoned prompt's prefill joins their step.
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 30)
        bad = await c.post("/v1/completions", json=poisoned) if poisoned else httpx.Response(0)
        return await streams, bad


def _core_pid(client: httpx.Client) -> tuple[int, int]:
    (replica,) = client.get("/health").json()["replicas"]["tiny"]
    return replica["pid"], replica["restarts"]


def test_a_poisoned_request_fails_alone_and_the_batch_goes_on(poisoned_server: Server) -> None:
    client = httpx.Client(base_url=poisoned_server.url, timeout=60)
    pid_before = _core_pid(client)
    # Without the poisoned request (which also shows that no good stream meets the token).
    reference, _ = asyncio.run(_run(poisoned_server.url, None))
    assert len(set(reference)) > 1
    poisoned = {"prompt": [1, 17, POISON, 42, 9], "max_tokens": 8, "temperature": 0}
    together, bad = asyncio.run(_run(poisoned_server.url, poisoned))
    assert together == reference, poisoned_server.log()[-4000:]
    assert bad.status_code == 502, bad.text
    assert "model step failed" in bad.json()["error"]["message"]
    # The step was retried in halves: it had the good streams in it.
    shared = [
        int(n) for n in re.findall(r"model step of (\d+) requests failed", poisoned_server.log())
    ]
    assert shared and max(shared) > 1, poisoned_server.log()
    deadline = time.monotonic() + 5
    while True:
        m = read_metrics(poisoned_server.url)
        idle = m["headrace:kv_cache_used_blocks"] == 0 and m["headrace:num_requests_running"] == 0
        if idle or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert idle, {k: v for k, v in m.items() if "kv_cache" in k or "num_requests" in k}
    assert _core_pid(client) == pid_before  # same core process, 0 restarts
    assert pid_before[1] == 0


def test_a_tiny_temperature_gives_the_greedy_text(poisoned_server: Server) -> None:
    body = {"prompt": "Once upon a time", "max_tokens": 16, "ignore_eos": True}
    with httpx.Client(base_url=poisoned_server.url, timeout=60) as c:
        greedy = c.post("/v1/completions", json={**body, "temperature": 0}).json()
        tiny = c.post("/v1/completions", json={**body, "temperature": 1e-40}).json()
    assert greedy["choices"][0]["text"]
    assert tiny["choices"][0]["text"] == greedy["choices"][0]["text"]
    assert tiny["usage"]["completion_tokens"] == 16
