"""`ReplicaActor` shared by several front ends, run in-process over a scripted engine (no Ray):
each front end pulls only its own requests' chunks, a start is done once for all, and a front
end that leaves (or stops pulling) has its requests cancelled without touching the others'."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from fake_engine import FakeEngine

from headrace.config import CacheConfig, ModelConfig, SchedulerConfig
from headrace.engine.frontend.client import GenerateOptions, GenerationChunk
from headrace.request import FinishReason, SamplingParams
from headrace.router import ray_actor
from headrace.router.ray_actor import ReplicaActor

PARAMS = SamplingParams(max_tokens=3, temperature=0.0)


class Scripted(FakeEngine):
    """Each request yields its prompt's tokens one at a time, waiting for `go` before each."""

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.cancelled: list[str] = []

    async def stream(
        self, request_id: str, prompt: list[int], params: SamplingParams,
        options: GenerateOptions | None,
    ) -> AsyncIterator[GenerationChunk]:  # fmt: skip
        try:
            for i, token in enumerate(prompt):
                await self.go.wait()
                done = FinishReason.LENGTH if i == len(prompt) - 1 else None
                yield GenerationChunk(request_id, f" w{token}", [token], done)
        except (asyncio.CancelledError, GeneratorExit):
            self.cancelled.append(request_id)
            raise


def actor_with(engine: Scripted) -> ReplicaActor:
    actor = ReplicaActor(ModelConfig(), CacheConfig(), SchedulerConfig(), "m")
    actor._engine = engine  # type: ignore[assignment]  # as if started
    return actor


async def pull_all(actor: ReplicaActor, client: str, n: int) -> list[Any]:
    items: list[Any] = []
    while len(items) < n:
        items += (await actor.pull(0.2, client)).items
    return items


def test_each_front_end_pulls_only_its_own_chunks() -> None:
    async def run() -> None:
        engine = Scripted()
        actor = actor_with(engine)
        opts = GenerateOptions()
        await actor.submit("a1", [1, 2], PARAMS, opts, "front-a")
        await actor.submit("b1", [7, 8, 9], PARAMS, opts, "front-b")
        engine.go.set()
        a, b = await asyncio.gather(pull_all(actor, "front-a", 2), pull_all(actor, "front-b", 3))
        assert [c.request_id for c in a] == ["a1", "a1"]
        assert [c.token_ids for c in b] == [[7], [8], [9]] and b[-1].finished
        # an id is free again once its request ended
        await actor.submit("a1", [3], PARAMS, opts, "front-b")
        assert [c.request_id for c in await pull_all(actor, "front-b", 1)] == ["a1"]

    asyncio.run(run())


def test_a_front_end_that_leaves_has_only_its_requests_cancelled() -> None:
    async def run() -> None:
        engine = Scripted()
        actor = actor_with(engine)
        for rid, client in (("a1", "front-a"), ("b1", "front-b")):
            await actor.submit(rid, [1, 2, 3], PARAMS, GenerateOptions(), client)
            await actor.pull(0.0, client)
        await asyncio.sleep(0.01)
        await actor.release("front-a")
        await asyncio.sleep(0.01)
        assert engine.cancelled == ["a1"]
        engine.go.set()
        assert [c.request_id for c in await pull_all(actor, "front-b", 3)] == ["b1"] * 3

    asyncio.run(run())


def test_a_front_end_that_stops_pulling_is_forgotten(monkeypatch: Any) -> None:
    monkeypatch.setattr(ray_actor, "CLIENT_TIMEOUT_S", 0.05)

    async def run() -> None:
        engine = Scripted()
        actor = actor_with(engine)
        await actor.submit("gone1", [1, 2, 3], PARAMS, GenerateOptions(), "gone")
        await actor.pull(0.0, "gone")
        await asyncio.sleep(0.1)
        await actor.pull(0.0, "alive")  # any front end's pull looks after the others
        await asyncio.sleep(0.01)
        assert engine.cancelled == ["gone1"]

    asyncio.run(run())


def test_a_second_start_waits_for_the_first(monkeypatch: Any) -> None:
    starts: list[int] = []

    async def run() -> None:
        actor = actor_with(Scripted())

        async def start_once() -> Any:
            starts.append(1)
            await asyncio.sleep(0.05)
            return "ready"

        monkeypatch.setattr(actor, "_start", start_once)
        both: list[Any] = list(await asyncio.gather(actor.start(), actor.start()))
        again: Any = await actor.start()
        assert both == ["ready", "ready"] and again == "ready" and starts == [1]

    asyncio.run(run())
