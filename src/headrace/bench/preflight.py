"""Before loading a server, make sure it answers: find the model name and send one tiny
request, so that a wrong URL or a server answering errors ends with one clear message instead of
a report full of failures. The request also warms the server up (first-call compilation, caches)."""

from __future__ import annotations

import json
from dataclasses import replace

import aiohttp

from headrace.bench import BenchError
from headrace.bench.client import Target, make_client, send
from headrace.bench.workloads import RequestSpec, Tenant


async def preflight(target: Target, tenant: Tenant | None = None) -> Target:
    """Returns `target` with the model filled in from `/v1/models` when none was given, and
    `ignore_eos` dropped when the server refuses it. Raises BenchError on any other failure."""
    async with make_client(target) as client:
        if target.model is None:
            target = replace(target, model=await _first_model(client, target, tenant))
        spec = RequestSpec(
            index=-1,
            prompt="the quick brown fox",
            prompt_words=4,
            max_tokens=2,
            tenant=tenant,
            kind="preflight",
        )
        result = await send(client, target, spec, 0.0)
        if not result.ok and target.ignore_eos and result.status in (400, 422):
            retry = replace(target, ignore_eos=False)
            if (again := await send(client, retry, spec, 0.0)).ok:
                return retry
            result = again
    if result.ok:
        return target
    if result.status is None:
        raise BenchError(f"cannot reach {target.url}: {result.message}")
    raise BenchError(
        f"{target.url}{target.path} answered {result.status} ({result.error}): "
        f"{_one_line(result.message)}"
    )


async def _first_model(
    client: aiohttp.ClientSession, target: Target, tenant: Tenant | None
) -> str | None:
    headers = {}
    key = tenant.api_key if tenant and tenant.api_key else target.api_key
    if key:
        headers["Authorization"] = f"Bearer {key}"
    try:
        timeout = aiohttp.ClientTimeout(total=10.0)
        async with client.get("/v1/models", headers=headers, timeout=timeout) as resp:
            if resp.status != 200:
                return None  # not every server lists models; the completion request will tell
            body = await resp.read()
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise BenchError(f"cannot reach {target.url}: {exc or type(exc).__name__}") from None
    try:
        data = json.loads(body).get("data") or []
        return str(data[0]["id"]) if data else None
    except (ValueError, AttributeError, KeyError, IndexError, TypeError):
        return None


def _one_line(message: str | None) -> str:
    text = " ".join((message or "").split())
    return text[:300] or "(no message)"
