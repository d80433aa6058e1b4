"""A retried request keeps its deadlines counting from its first arrival (in process, with
fake replicas): with an `arrival_time` the options go on unchanged (the engine counts from
it), without one the router hands the retry only the time left."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from fake_engine import FakeEngine

from headrace.engine.frontend.client import GenerateOptions, GenerationChunk
from headrace.request import FinishReason, SamplingParams
from headrace.router.replica import Replica
from headrace.router.router import Router

SPENT_S = 0.2  # how long the first replica takes to fail


class FailingEngine(FakeEngine):
    """Fails (and goes unhealthy) after `fail_after_s`, or records the options and finishes."""

    def __init__(self, fail_after_s: float | None = None) -> None:
        self.fail_after_s = fail_after_s
        self.seen: list[GenerateOptions] = []

    async def stream(
        self, request_id: str, prompt: list[int], params: SamplingParams,
        options: GenerateOptions | None,
    ) -> AsyncIterator[GenerationChunk]:  # fmt: skip
        assert options is not None
        self.seen.append(options)
        if self.fail_after_s is not None:
            await asyncio.sleep(self.fail_after_s)
            self.healthy = False
            yield GenerationChunk(request_id, "", [], FinishReason.ERROR, error="gone")
            return
        yield GenerationChunk(request_id, "x", [3], FinishReason.LENGTH, completion_tokens=1)


def run_retry(options: GenerateOptions) -> tuple[GenerateOptions, list[GenerationChunk]]:
    failing, healthy = FailingEngine(fail_after_s=SPENT_S), FailingEngine()
    router = Router("m", [Replica("m/0", failing), Replica("m/1", healthy)])
    router.policy.choose = lambda candidates: candidates[0]  # type: ignore[method-assign]

    async def collect() -> list[GenerationChunk]:
        return [c async for c in router.generate("r", [1, 2], SamplingParams(), options)]

    chunks = asyncio.run(collect())
    assert router.retries == 1 and len(healthy.seen) == 1
    return healthy.seen[0], chunks


def test_with_an_arrival_time_the_retry_gets_the_options_unchanged() -> None:
    options = GenerateOptions(timeout_s=10.0, queue_timeout_s=4.0, arrival_time=time.monotonic())
    seen, chunks = run_retry(options)
    assert seen == options  # the engine counts from arrival_time: no second subtraction
    assert chunks[-1].finish_reason is FinishReason.LENGTH


def test_without_an_arrival_time_the_retry_gets_the_time_left() -> None:
    seen, _ = run_retry(GenerateOptions(timeout_s=10.0, queue_timeout_s=4.0))
    assert seen.timeout_s is not None and seen.queue_timeout_s is not None
    assert 10.0 - 2 < seen.timeout_s <= 10.0 - SPENT_S
    assert 4.0 - 2 < seen.queue_timeout_s <= 4.0 - SPENT_S
