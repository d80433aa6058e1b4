"""A tenant refused for a full queue hears its own figures only, against a real
`headrace serve --tenants FILE` on 127.0.0.1: not how many requests others (of a more urgent
tier here) have queued, nor the bound those figures would be read against."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator

import httpx
import pytest
from factories import Server, make_tiny_llama, serving, tiny_server_args, write_tenants

from headrace.gateway.auth import hash_key

BOUND = 2
TENANTS = f"""
tiers:
  paid: {{queue_timeout_s: 60}}
  free: {{queue_timeout_s: 60}}
tenants:
  vip: {{tier: paid, api_key_sha256: [{hash_key("vip-key")}]}}
  small: {{tier: free, api_key_sha256: [{hash_key("small-key")}]}}
"""
LONG = {"prompt": "fill the queue", "max_tokens": 400, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("overload-text")
    model = make_tiny_llama(tmp / "tiny-llama")
    args = tiny_server_args(model) + [
        "--tenants", str(write_tenants(tmp, TENANTS)), "--max-num-seqs", "1",
        "--max-queued-requests", str(BOUND),
    ]  # fmt: skip
    yield from serving(args, tmp)


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


async def refusals(url: str) -> tuple[httpx.Response, httpx.Response]:
    """(vip's own 503 once the queue is full of its requests, small's 503 right after)."""
    async with httpx.AsyncClient(base_url=url, timeout=120) as c:
        vip = [asyncio.create_task(c.post("/v1/generate", json=LONG, headers=auth("vip-key")))
               for _ in range(BOUND + 3)]  # fmt: skip
        try:
            for done in asyncio.as_completed(vip):
                first = await done  # the refused ones come back first, at once
                break
            assert first.status_code == 503, first.text
            small = await c.post("/v1/generate", json=LONG, headers=auth("small-key"))
        finally:
            await asyncio.gather(*vip)
    return first, small


def test_a_refused_tenant_hears_nothing_of_the_other_tenants_queue(server: Server) -> None:
    vip, small = asyncio.run(refusals(server.url))
    assert small.status_code == 503, small.text
    message = small.json()["error"]["message"]
    assert small.json()["error"]["type"] == "overloaded_error"
    assert "more urgent tiers" in message
    assert not re.findall(r"\d+", message), message  # no count of vip's requests, no bound
    assert int(small.headers["retry-after"]) >= 1
    own = vip.json()["error"]["message"]  # vip alone fills the queue: its own count only
    assert re.findall(r"\d+", own) == [str(BOUND)], own
