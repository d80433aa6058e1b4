"""Two replicas of one model behind the router, as real processes on 127.0.0.1: both serve,
least load picks the less-loaded one, a killed or hung replica is replaced while requests
that had not started move to the other one, and those that had resume there."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from factories import Server, replicas, routed, running, serve_args, wait_for, word_prompt

STALL_S = 3.0


@pytest.fixture(scope="module")
def server(
    tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    args = serve_args(
        f"alpha={tiny_models['alpha']}:2",
        # No speculation: the tiny model repeats itself, and with drafts a 200-token stream
        # could end in the 0.3 s before the kill (the kill test's snapshot then lied).
        extra=("--max-num-seqs", "2", "--replica-stall-timeout-s", str(STALL_S),
               "--num-speculative-tokens", "0"),
    )  # fmt: skip
    with running(args, tmp_path_factory.mktemp("replicas")) as s:
        yield s


def body(
    max_tokens: int, *, words: int = 8, start: int = 5, stream: bool = False
) -> dict[str, Any]:
    return {
        "model": "alpha", "prompt": word_prompt(words, start), "max_tokens": max_tokens,
        "temperature": 0, "ignore_eos": True, "stream": stream,
    }  # fmt: skip


async def one(client: httpx.AsyncClient, b: dict[str, Any]) -> tuple[int, list[dict[str, Any]]]:
    """(status, events): a stream's JSON events, or the one JSON body."""
    if not b["stream"]:
        r = await client.post("/v1/generate", json=b)
        return r.status_code, [r.json()]
    async with client.stream("POST", "/v1/generate", json=b) as r:
        lines = [line async for line in r.aiter_lines() if line.startswith("data: ")]
    return r.status_code, [json.loads(x[6:]) for x in lines if x != "data: [DONE]"]


def succeeded(status: int, events: list[dict[str, Any]], max_tokens: int) -> bool:
    last = events[-1] if events else {}
    return (
        status == 200
        and last.get("finish_reason") == "length"
        and last["usage"]["completion_tokens"] == max_tokens
    )


def test_both_replicas_serve_under_concurrent_load(server: Server) -> None:
    before = routed(server.url, "alpha")

    async def run() -> list[tuple[int, list[dict[str, Any]]]]:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
            return await asyncio.gather(*(one(c, body(24)) for _ in range(8)))

    results = asyncio.run(run())
    assert all(succeeded(s, e, 24) for s, e in results), results
    after = routed(server.url, "alpha")
    served = {name: after[name] - before[name] for name in after}
    assert sum(served.values()) == 8
    assert min(served.values()) >= 2, served


def test_least_load_sends_a_new_request_to_the_less_loaded_replica(server: Server) -> None:
    async def run() -> tuple[list[dict[str, Any]], dict[str, int], dict[str, int]]:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
            streams = []  # (context, lines): a dropped line iterator would close its stream
            for max_tokens in (480, 40):  # a long request, then a short one: unequal loads
                cm = c.stream("POST", "/v1/generate", json=body(max_tokens, stream=True))
                lines = (await cm.__aenter__()).aiter_lines()
                streams.append((cm, lines))
                while not (await anext(lines)).startswith("data: "):
                    pass  # its first text arrived: it is running
            try:
                seen = await asyncio.to_thread(replicas, server.url, "alpha")
                before = {r["name"]: r["routed"] for r in seen}
                r = await c.post("/v1/generate", json=body(1))
                assert r.status_code == 200
                after = await asyncio.to_thread(routed, server.url, "alpha")
            finally:
                for cm, _ in streams:
                    await cm.__aexit__(None, None, None)  # leave: the router aborts them
            return seen, before, after

    seen, before, after = asyncio.run(run())
    load = {r["name"]: r["reported_tokens"] for r in seen}
    # the long request still runs on one replica (the short one may be done already)
    assert max(load.values()) - min(load.values()) > 150, json.dumps(seen, indent=1)
    (chosen,) = [name for name in after if after[name] > before[name]]
    assert chosen == min(load, key=lambda name: load[name]), (chosen, load)


def text(events: list[dict[str, Any]]) -> str:
    return "".join(str(e.get("text", "")) for e in events)


def test_sigkill_a_replica_mid_load_resumes_its_streams(server: Server) -> None:
    url = server.url
    n, max_tokens = 10, 480  # long enough that no stream ends before the kill on a fast host
    bodies = [body(max_tokens, start=5 + 37 * i, stream=i % 2 == 0) for i in range(n)]
    counts = httpx.get(url + "/v1/stats").json()["models"]["alpha"]

    async def run(kill: bool) -> tuple[list[tuple[int, list[dict[str, Any]]]], dict[str, Any]]:
        async with httpx.AsyncClient(base_url=url, timeout=90) as c:
            tasks = [asyncio.ensure_future(one(c, b)) for b in bodies]
            victim: dict[str, Any] = {}
            if kill:

                def all_started() -> bool:  # 2 running (streaming) on each, the rest waiting
                    reps = replicas(url, "alpha")  # (5 + 5 as a rule; two requests routed at
                    # the same moment may make it 6 + 4)
                    placed = sum(r["num_running"] + r["num_waiting"] for r in reps)
                    return sum(r["num_running"] for r in reps) == 4 and placed == n

                await asyncio.to_thread(wait_for, all_started, 30, "every request placed")
                await asyncio.sleep(0.1)  # the running ones have streamed some tokens
                reps = await asyncio.to_thread(replicas, url, "alpha")
                victim = max(reps, key=lambda r: r["num_waiting"])
                os.kill(victim["pid"], signal.SIGKILL)
            results = await asyncio.wait_for(asyncio.gather(*tasks), 90)  # nobody hangs
            return results, victim

    reference, _ = asyncio.run(run(kill=False))
    results, victim = asyncio.run(run(kill=True))
    assert all(succeeded(*r, max_tokens) for r in reference), reference
    assert all(succeeded(*r, max_tokens) for r in results), [r[1][-1] for r in results]
    assert [text(e) for _, e in results] == [text(e) for _, e in reference]
    assert [e[-1]["usage"] for _, e in results] == [e[-1]["usage"] for _, e in reference]
    stats = httpx.get(url + "/v1/stats").json()["models"]["alpha"]
    assert victim["num_running"] == 2 and victim["num_waiting"] >= 1
    assert stats["resumes"] - counts["resumes"] == victim["num_running"]
    assert stats["retries"] - counts["retries"] >= victim["num_waiting"]

    def restarted() -> bool:
        (rep,) = [r for r in replicas(url, "alpha") if r["name"] == victim["name"]]
        return rep["state"] == "healthy" and rep["restarts"] == 1 and rep["pid"] != victim["pid"]

    wait_for(restarted, 90, "the killed replica to restart")
    before = routed(url, "alpha")
    for _ in range(4):
        r = httpx.post(url + "/v1/generate", json=body(4), timeout=60)
        assert succeeded(r.status_code, [r.json()], 4)
    assert routed(url, "alpha")[victim["name"]] > before[victim["name"]], json.dumps(
        replicas(url, "alpha"), indent=1
    )
    idle = lambda: all(  # noqa: E731
        r["kv_blocks_used"] == 0 and r["in_flight"] == 0 and r["kv_blocks_total"] > 0
        for r in replicas(url, "alpha")
    )
    wait_for(idle, 10, "every replica to report 0 used KV blocks")
    health = httpx.get(url + "/health").json()
    assert [r["state"] for r in health["replicas"]["alpha"]] == ["healthy", "healthy"]


def test_a_replica_that_stops_answering_is_replaced(server: Server) -> None:
    url = server.url
    victim = replicas(url, "alpha")[1]
    os.kill(victim["pid"], signal.SIGSTOP)  # alive, but silent: no more stats
    try:

        async def run() -> list[tuple[int, list[dict[str, Any]]]]:
            async with httpx.AsyncClient(base_url=url, timeout=60) as c:
                return await asyncio.gather(*(one(c, body(8)) for _ in range(4)))

        t0 = time.monotonic()
        results = asyncio.run(run())  # some land on the silent one: retried once it is killed
        assert all(succeeded(s, e, 8) for s, e in results), results
        assert time.monotonic() - t0 < STALL_S + 20

        def replaced() -> bool:
            rep = replicas(url, "alpha")[1]
            return rep["state"] == "healthy" and rep["pid"] != victim["pid"]

        wait_for(replaced, 90, "the silent replica to be replaced")
        rep = replicas(url, "alpha")[1]
        assert rep["restarts"] == victim["restarts"] + 1
        assert "no report" in rep["last_error"]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim["pid"], signal.SIGCONT)
