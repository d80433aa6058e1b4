"""Tenant-fair shedding end to end: a real `headrace serve --tenants FILE` on 127.0.0.1.

One tenant floods (40 clients that come straight back after a 503), so the queue stays at
`--max-queued-requests`; another tenant of the same tier, far under its share, sends a few
requests again and again while it does. None of them may be refused.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest
from factories import Server, make_tiny_llama, serving, tiny_server_args, write_tenants

from headrace.gateway.auth import hash_key

BOUND = 8
TENANTS = f"""
tiers:
  free: {{queue_timeout_s: 60}}
tenants:
  hog: {{tier: free, api_key_sha256: [{hash_key("hog-key")}]}}
  light: {{tier: free, api_key_sha256: [{hash_key("light-key")}]}}
"""
HOG_BODY = {"prompt": "flood the queue", "max_tokens": 40, "ignore_eos": True}
LIGHT_BODY = {"prompt": "just one", "max_tokens": 4, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("fair-shedding")
    model = make_tiny_llama(tmp / "tiny-llama")
    tenants = write_tenants(tmp, TENANTS)
    args = tiny_server_args(model) + [
        "--tenants", str(tenants), "--max-num-seqs", "2", "--max-queued-requests", str(BOUND),
    ]  # fmt: skip
    yield from serving(args, tmp)


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


class Flood:
    """The hog's clients: each sends, and after a 503 comes back 50 ms later."""

    def __init__(self) -> None:
        self.statuses: Counter[int] = Counter()
        self.refused = asyncio.Condition()
        self.stop = asyncio.Event()
        self.bad: list[str] = []  # 503s without an overloaded error or a Retry-After

    async def client(self, c: httpx.AsyncClient) -> None:
        while not self.stop.is_set():
            r = await c.post("/v1/generate", json=HOG_BODY, headers=auth("hog-key"))
            self.statuses[r.status_code] += 1
            if r.status_code != 503:
                continue
            if r.json()["error"]["type"] != "overloaded_error" or not (
                int(r.headers.get("retry-after", "0")) >= 1
            ):
                self.bad.append(f"{r.headers} {r.text}")
            async with self.refused:
                self.refused.notify_all()
            await asyncio.sleep(0.05)

    async def full(self) -> None:
        """Return once the hog has been refused again: its queue is at the bound now."""
        async with self.refused:
            await asyncio.wait_for(self.refused.wait(), 60)


def test_a_flood_does_not_get_another_tenant_refused(server: Server) -> None:
    async def scenario() -> tuple[Flood, list[int]]:
        flood = Flood()
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits) as c:
            hogs = [asyncio.create_task(flood.client(c)) for _ in range(40)]
            light: list[int] = []
            try:
                for _ in range(4):  # the race is timing-dependent: give it several chances
                    await flood.full()
                    rs = await asyncio.gather(
                        *(
                            c.post("/v1/generate", json=LIGHT_BODY, headers=auth("light-key"))
                            for _ in range(3)
                        )
                    )
                    light += [r.status_code for r in rs]
            finally:
                flood.stop.set()
                await asyncio.gather(*hogs)
        return flood, light

    flood, light = asyncio.run(scenario())
    assert light == [200] * 12, light
    assert set(flood.statuses) <= {200, 503}, flood.statuses
    assert flood.statuses[503] >= 4 and flood.statuses[200] >= 2, flood.statuses
    assert not flood.bad, flood.bad[:3]
