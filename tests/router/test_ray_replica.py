"""`RayEngine` against a scripted stand-in for the actor handle (no Ray): chunks reach their
own request, a refusal is a ValueError before any chunk, a caller that leaves cancels the
request in the actor, and a failed pull or a dead engine core takes the replica down with an
error chunk on every open stream."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import Any

import pytest
import ray

from headrace.engine.frontend.client import GenerationChunk
from headrace.engine.messages import StepStats
from headrace.request import FinishReason, SamplingParams
from headrace.router.ray_actor import Pulled, Refusal, ReplicaReady
from headrace.router.ray_replica import RayEngine

PARAMS = SamplingParams(max_tokens=4, temperature=0.0)


class Ref:
    """An ObjectRef's two faces: awaitable, and `future()`."""

    def __init__(self, coro: Awaitable[Any]) -> None:
        self._future: Future[Any] = Future()
        self._task = asyncio.ensure_future(coro)
        self._task.add_done_callback(self._settle)

    def _settle(self, task: asyncio.Future[Any]) -> None:
        if task.exception() is not None:
            self._future.set_exception(task.exception())  # type: ignore[arg-type]
        else:
            self._future.set_result(task.result())

    def future(self) -> Future[Any]:
        return self._future

    def __await__(self) -> Any:
        return self._task.__await__()


class Method:
    def __init__(self, fn: Callable[..., Awaitable[Any]]) -> None:
        self.fn = fn

    def remote(self, *args: Any) -> Ref:
        return Ref(self.fn(*args))


class FakeActor:
    """Answers pulls from a queue the test fills; records submits and cancels."""

    def __init__(self) -> None:
        self.pulls: asyncio.Queue[Pulled | Exception] = asyncio.Queue()
        self.submitted: list[str] = []
        self.cancelled: list[str] = []
        self.released: list[str] = []
        self.closed = False
        self.submit = Method(self._submit)
        self.cancel = Method(self._cancel)
        self.abort = Method(self._cancel)
        self.pull = Method(self._pull)
        self.close = Method(self._close)
        self.release = Method(self._release)

    async def _submit(self, request_id: str, *_: Any) -> None:
        self.submitted.append(request_id)

    async def _cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)

    async def _pull(self, wait_s: float, client: str) -> Pulled:
        item = await self.pulls.get()
        if isinstance(item, Exception):
            raise item
        return item

    async def _close(self) -> None:
        self.closed = True

    async def _release(self, client: str) -> None:
        self.released.append(client)


def chunk(rid: str, token: int, done: bool = False) -> GenerationChunk:
    reason = FinishReason.LENGTH if done else None
    return GenerationChunk(rid, f" w{token}", [token], reason)


async def started(shared: bool = False) -> tuple[RayEngine, FakeActor]:
    actor = FakeActor()
    ready = ReplicaReady("tiny", 64, tokenizer=None, node_id="n" * 16, node_ip="127.0.0.1")
    actor.start = Method(lambda: _value(ready))  # type: ignore[attr-defined]
    return await RayEngine.start(actor, shared), actor


async def _value(value: Any) -> Any:
    return value


async def collect(engine: RayEngine, rid: str) -> list[GenerationChunk]:
    return [c async for c in engine.generate(rid, [1, 2, 3], PARAMS)]


def test_chunks_reach_their_request_and_stats_are_the_load_report() -> None:
    async def run() -> None:
        engine, actor = await started()
        a = asyncio.create_task(collect(engine, "a"))
        b = asyncio.create_task(collect(engine, "b"))
        await asyncio.sleep(0.01)
        stats = StepStats(num_running=2, kv_blocks_used=3)
        await actor.pulls.put(Pulled([chunk("a", 5), chunk("b", 7), chunk("a", 6, True)], stats))
        await actor.pulls.put(Pulled([chunk("b", 8, True)]))
        assert [c.token_ids for c in await a] == [[5], [6]]
        assert [c.token_ids for c in await b] == [[7], [8]]
        assert engine.stats() is stats and engine.is_healthy
        assert sorted(actor.submitted) == ["a", "b"] and actor.cancelled == []
        await engine.close()

    asyncio.run(run())


def test_a_refusal_is_a_value_error_before_any_chunk() -> None:
    async def run() -> None:
        engine, actor = await started()
        task = asyncio.create_task(collect(engine, "big"))
        await asyncio.sleep(0.01)
        await actor.pulls.put(Pulled([Refusal("big", "prompt + max_tokens exceed 64")]))
        with pytest.raises(ValueError, match="exceed 64"):
            await task
        assert engine.is_healthy and actor.cancelled == []
        await engine.close()

    asyncio.run(run())


def test_a_caller_that_leaves_cancels_the_request_in_the_actor() -> None:
    async def run() -> None:
        engine, actor = await started()
        stream = engine.generate("gone", [1, 2], PARAMS)
        await actor.pulls.put(Pulled([chunk("gone", 5)]))
        assert (await anext(stream)).token_ids == [5]
        await stream.aclose()
        await asyncio.sleep(0.01)
        assert actor.cancelled == ["gone"] and engine.num_open_requests == 0
        await engine.close()

    asyncio.run(run())


@pytest.mark.parametrize(
    "death",
    [RuntimeError("ActorDiedError: the actor died"), Pulled([], None, "its engine core is gone")],
)
def test_a_dead_actor_or_core_ends_every_stream_and_takes_the_replica_down(
    death: Pulled | Exception,
) -> None:
    async def run() -> None:
        engine, actor = await started()
        tasks = [asyncio.create_task(collect(engine, rid)) for rid in ("a", "b")]
        await asyncio.sleep(0.01)
        await actor.pulls.put(Pulled([chunk("a", 5)]))
        await actor.pulls.put(death)
        results = await asyncio.wait_for(asyncio.gather(*tasks), 5)
        assert [c.finish_reason for c in results[0]] == [None, FinishReason.ERROR]
        assert [c.finish_reason for c in results[1]] == [FinishReason.ERROR]
        assert not engine.is_healthy and engine.failure is not None
        late = await collect(engine, "late")  # routed here before the router noticed
        assert [c.finish_reason for c in late] == [FinishReason.ERROR]
        await engine.close()

    asyncio.run(run())


@pytest.mark.parametrize("failed", [False, True])
def test_a_shared_replica_is_left_running_unless_it_failed(failed: bool) -> None:
    async def run() -> None:
        engine, actor = await started(shared=True)
        if failed:
            await actor.pulls.put(Pulled([], None, "its engine core is gone"))
            await asyncio.sleep(0.01)
        await engine.close()
        assert actor.closed is failed  # a failed one is stopped (and killed)
        assert len(actor.released) == (0 if failed else 1)  # a healthy one: only ours cancelled

    asyncio.run(run())
    # Stopping the stand-in must not have started a Ray cluster in this process (ray.kill
    # connects on first use, on the machine's own address, outside any namespace).
    assert not ray.is_initialized()
