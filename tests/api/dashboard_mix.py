"""An overload mix for the dashboard's tests and screenshots: a paid tenant, a free one, a free
tenant flooding (many streams at once, past its concurrency limit) and a batch tenant, each a
closed loop of requests against a real server on 127.0.0.1, run in a thread."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter

import httpx

from headrace.gateway.auth import hash_key

ADMIN = "admin-secret"
# name, tier, concurrent loops
MIX = (("acme", "paid", 2), ("calm", "free", 1), ("flood", "free", 10), ("nightly", "batch", 2))


def tenants_yaml() -> str:
    lines = [f"admin_key_sha256: [{hash_key(ADMIN)}]", "tenants:"]
    for name, tier, _ in MIX:
        limit = ", max_concurrent: 4" if name == "flood" else ""  # it meets its limit: 429
        key = hash_key(name + "-key")
        lines.append(f"  {name}: {{tier: {tier}, api_key_sha256: [{key}]{limit}}}")
    return "\n".join(lines) + "\n"


class Load:
    """The mix, running until `stop()`; `statuses` counts the answers by HTTP status."""

    def __init__(self, url: str, max_tokens: int = 24) -> None:
        self.url = url
        self.max_tokens = max_tokens
        self.statuses: Counter[int] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self) -> Load:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)

    async def _run(self) -> None:
        async with httpx.AsyncClient(base_url=self.url, timeout=60) as client:
            loops = [self._loop(client, name) for name, _, n in MIX for _ in range(n)]
            await asyncio.gather(*loops)

    async def _loop(self, client: httpx.AsyncClient, tenant: str) -> None:
        body = {"prompt": f"{tenant} says hello", "max_tokens": self.max_tokens, "ignore_eos": True}
        headers = {"authorization": f"Bearer {tenant}-key"}
        while not self._stop.is_set():
            r = await client.post("/v1/generate", json=body, headers=headers)
            self.statuses[r.status_code] += 1
            if r.status_code != 200:
                await asyncio.sleep(0.2)
