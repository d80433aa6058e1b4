"""The gateway end to end: a real `headrace serve --tenants FILE` on 127.0.0.1, tiny model."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator

import httpx
import pytest
from factories import Server, make_tiny_llama, read_metrics, start_server, tiny_server_args

from headrace.gateway.auth import hash_key

ADMIN = "admin-secret"
FLOOD_DEADLINE_S = 3.0  # the two running requests start well within it on a loaded machine
TENANTS = f"""
admin_key_sha256: [{hash_key(ADMIN)}]
tiers:
  free: {{queue_timeout_s: 60}}
tenants:
  acme: {{tier: paid, api_key_sha256: [{hash_key("acme-key")}]}}
  bob: {{tier: free, api_key_sha256: [{hash_key("bob-key")}], tokens_per_minute: 200}}
  solo: {{tier: free, api_key_sha256: [{hash_key("solo-key")}], max_concurrent: 1}}
  crowd: {{tier: free, api_key_sha256: [{hash_key("crowd-key")}]}}
  flood:
    tier: free
    api_key_sha256: [{hash_key("flood-key")}]
    queue_timeout_s: {FLOOD_DEADLINE_S}
"""
ROUTES = {
    "/v1/generate": {"prompt": "Hello there", "max_tokens": 4},
    "/v1/completions": {"model": "tiny", "prompt": "Hello there", "max_tokens": 4},
    "/v1/chat/completions": {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 4,
    },
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("gateway")
    model = make_tiny_llama(tmp / "tiny-llama")
    tenants = tmp / "tenants.yaml"
    tenants.write_text(TENANTS)
    args = tiny_server_args(model) + [
        "--tenants", str(tenants), "--max-num-seqs", "2", "--max-queued-requests", "6",
    ]  # fmt: skip
    srv = start_server(args, tmp)
    try:
        srv.wait_ready()
        yield srv
    finally:
        code = srv.stop()
    # uvicorn re-raises the SIGTERM it handled once it has shut down cleanly: -15 is clean too.
    assert code in (0, -signal.SIGTERM), srv.log()


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def gauges(server: Server) -> tuple[float, float, float]:
    m = read_metrics_admin(server)
    return (
        m["headrace:num_requests_running"],
        m["headrace:num_requests_waiting"],
        m["headrace:kv_cache_used_blocks"],
    )


def read_metrics_admin(server: Server) -> dict[str, float]:
    return read_metrics(server.url, auth(ADMIN))


def test_keys_on_every_generation_route(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        assert c.get("/health").status_code == 200
        for path, body in ROUTES.items():
            for headers in ({}, auth("wrong"), {"x-api-key": hash_key("acme-key")}):
                r = c.post(path, json=body, headers=headers)
                assert r.status_code == 401, (path, headers, r.text)
                assert r.json()["error"]["type"] == "authentication_error"
            ok = c.post(path, json=body, headers=auth("acme-key"))
            assert ok.status_code == 200, (path, ok.text)
            assert c.post(path, json=body, headers={"x-api-key": "crowd-key"}).status_code == 200
        assert c.get("/metrics").status_code == 401
        metrics = c.get("/metrics", headers=auth(ADMIN))
        assert metrics.status_code == 200
        assert 'reason="auth"' in metrics.text


def test_tokens_per_minute_limit(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        body = {"prompt": "one two three", "max_tokens": 140, "ignore_eos": True}
        first = c.post("/v1/generate", json=body, headers=auth("bob-key"))
        assert first.status_code == 200, first.text
        need = sum(first.json()["usage"].values())  # prompt + 140, all of it used
        assert first.headers["x-ratelimit-limit-tokens"] == "200"
        assert first.headers["x-ratelimit-remaining-tokens"] == str(200 - need)
        second = c.post("/v1/generate", json=body, headers=auth("bob-key"))
        assert second.status_code == 429, second.text
        assert second.json()["error"]["type"] == "rate_limit_error"
        assert second.json()["error"]["code"] == 429
        # The wait is for the missing tokens at 200/60 tokens per second, less what trickled
        # back while the first request ran.
        retry = float(second.headers["retry-after-ms"]) / 1000
        expected = (need - (200 - need)) / (200 / 60)
        assert expected - 15 < retry <= expected + 0.01
        assert int(second.headers["retry-after"]) == pytest.approx(retry, abs=1)
        assert "x-ratelimit-reset-tokens" in second.headers
        other = c.post("/v1/generate", json=body, headers=auth("acme-key"))
        assert other.status_code == 200  # another tenant at the same moment


async def _hold_stream(url: str, key: str, started: asyncio.Event, release: asyncio.Event) -> int:
    body = {"prompt": "hold", "max_tokens": 120, "ignore_eos": True, "stream": True}
    async with (
        httpx.AsyncClient(base_url=url, timeout=60) as c,
        c.stream("POST", "/v1/generate", json=body, headers=auth(key)) as r,
    ):
        async for _ in r.aiter_lines():
            started.set()
            await release.wait()
            break
        return r.status_code


def test_concurrency_limit(server: Server) -> None:
    async def scenario() -> None:
        started, release = asyncio.Event(), asyncio.Event()
        holder = asyncio.create_task(_hold_stream(server.url, "solo-key", started, release))
        await asyncio.wait_for(started.wait(), 60)
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
            body = {"prompt": "x", "max_tokens": 2}
            refused = await c.post("/v1/generate", json=body, headers=auth("solo-key"))
            other = await c.post("/v1/generate", json=body, headers=auth("crowd-key"))
            release.set()
            assert await holder == 200
            assert refused.status_code == 429, refused.text
            assert "limit is 1" in refused.json()["error"]["message"]
            assert 1 <= int(refused.headers["retry-after"]) <= 60
            assert other.status_code == 200
            for _ in range(100):  # the held stream was closed: solo is free again
                again = await c.post("/v1/generate", json=body, headers=auth("solo-key"))
                if again.status_code == 200:
                    break
                await asyncio.sleep(0.05)
            assert again.status_code == 200

    asyncio.run(scenario())


def test_paid_is_admitted_before_every_waiting_free_request(server: Server) -> None:
    """Two free streams fill the pool (--max-num-seqs 2), three more wait; a paid request that
    arrives later gets its first token before any of the three."""
    first_token: dict[str, float] = {}

    async def stream(c: httpx.AsyncClient, name: str, key: str) -> None:
        body = {"prompt": "tell me", "max_tokens": 140, "ignore_eos": True, "stream": True}
        async with c.stream("POST", "/v1/generate", json=body, headers=auth(key)) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data: ") and name not in first_token:
                    first_token[name] = time.monotonic()

    async def scenario() -> list[str]:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as c:
            frees = [asyncio.create_task(stream(c, f"free{i}", "crowd-key")) for i in range(5)]
            while len(first_token) < 2:
                await asyncio.sleep(0.005)
            await asyncio.sleep(0.05)  # the two running ones have long to go
            waiting = [f"free{i}" for i in range(5) if f"free{i}" not in first_token]
            await stream(c, "paid", "acme-key")
            await asyncio.gather(*frees)
            return waiting

    waiting = asyncio.run(scenario())
    assert len(waiting) == 3
    assert all(first_token["paid"] < first_token[name] for name in waiting), first_token
    assert read_metrics_admin(server)["headrace:num_preemptions_total"] >= 1


def test_overload_flood_is_refused_fast_and_drains(server: Server) -> None:
    async def one(c: httpx.AsyncClient, i: int) -> tuple[httpx.Response, float]:
        t = time.monotonic()
        body = {"prompt": f"flood {i}", "max_tokens": 100, "ignore_eos": True}
        r = await c.post("/v1/generate", json=body, headers=auth("flood-key"))
        return r, time.monotonic() - t

    async def scenario() -> list[tuple[httpx.Response, float]]:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as c:
            return list(await asyncio.gather(*(one(c, i) for i in range(30))))

    before = read_metrics_admin(server)
    results = asyncio.run(scenario())
    statuses = [r.status_code for r, _ in results]
    assert set(statuses) <= {200, 503}, statuses
    # 2 run, at most 6 may wait (--max-queued-requests): the rest is refused at arrival.
    assert statuses.count(503) >= 30 - 2 - 6 and statuses.count(200) >= 2
    at_arrival = 0
    for r, took in results:
        if r.status_code != 503:
            continue
        err = r.json()["error"]
        assert (err["type"], err["code"]) == ("overloaded_error", 503)
        assert took < FLOOD_DEADLINE_S + 5  # nobody hangs past the deadline
        if err["message"].startswith("server overloaded"):
            at_arrival += 1
            assert int(r.headers["retry-after"]) >= 1
            assert took < FLOOD_DEADLINE_S  # refused at once, not at the deadline
    assert at_arrival >= 30 - 2 - 6
    for _ in range(300):
        if gauges(server) == (0, 0, 0):
            break
        time.sleep(0.1)
    assert gauges(server) == (0, 0, 0)
    after = read_metrics_admin(server)
    key = 'headrace:gateway_requests_rejected_total{reason="overloaded",tenant="flood",tier="free"}'
    assert after[key] - before.get(key, 0.0) == at_arrival
    ok = 'headrace:gateway_requests_admitted_total{tenant="flood",tier="free"}'
    assert after[ok] - before.get(ok, 0.0) == 30 - at_arrival
