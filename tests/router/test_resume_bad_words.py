"""A stream resumed in the middle of a bad word (a real engine on a tiny model: bad_words act
in its logits processors): the continuation does not complete the word, and the whole stream
is the one an undisturbed run with that bad word gives."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

from fake_engine import FakeEngine

from headrace.config import CacheConfig, ModelConfig, RouterConfig, SchedulerConfig
from headrace.engine.frontend.async_engine import AsyncEngine
from headrace.engine.frontend.client import GenerateOptions, GenerationChunk
from headrace.request import FinishReason, SamplingParams
from headrace.router.replica import Replica
from headrace.router.router import Router

PROMPT = [5, 9, 14, 3]
GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


class DiesAfter(FakeEngine):
    """`engine`'s stream, cut after `n` tokens by a replica failure (as a dead process's)."""

    def __init__(self, engine: AsyncEngine, n: int) -> None:
        self.engine, self.n = engine, n
        self.tokenizer = engine.tokenizer
        self.max_model_len = engine.max_model_len

    async def stream(
        self, request_id: str, prompt: list[int], params: SamplingParams,
        options: GenerateOptions | None,
    ) -> AsyncIterator[GenerationChunk]:  # fmt: skip
        got = 0
        inner = self.engine.generate(request_id, prompt, params, options)
        try:
            async for chunk in inner:
                yield chunk
                got += len(chunk.token_ids)
                if got >= self.n:
                    break
        finally:
            await inner.aclose()  # type: ignore[attr-defined]
        self.healthy = False
        yield GenerationChunk(request_id, "", [], FinishReason.ERROR, error="exited")


def tokens(chunks: list[GenerationChunk]) -> list[int]:
    return [t for c in chunks for t in c.token_ids]


def test_a_bad_word_begun_before_a_failover_is_not_completed_after_it(
    tiny_models: dict[str, Path],
) -> None:
    model = ModelConfig(model=str(tiny_models["alpha"]), dtype="float32", num_threads=1)
    cache = CacheConfig(block_size=16, num_kv_blocks=64)

    async def main() -> tuple[list[int], list[int], list[int]]:
        engine = await AsyncEngine.start(model, cache, SchedulerConfig(), in_process=True)
        try:

            async def alone(params: SamplingParams) -> list[int]:
                return tokens([c async for c in engine.generate("r", PROMPT, params)])

            plain = await alone(GREEDY)
            # The plain run's tokens 4 and 5 as a bad word: its first token is sent before
            # the replica dies, its last would be the resumed stream's first.
            params = dataclasses.replace(GREEDY, bad_words=((plain[4], plain[5]),))
            undisturbed = await alone(params)
            router = Router(
                "m", [Replica("m/0", DiesAfter(engine, 5)), Replica("m/1", engine)],
                RouterConfig(resume_wait_s=5.0),
            )  # fmt: skip
            router.policy.choose = lambda candidates: candidates[0]  # type: ignore[method-assign]
            resumed = tokens([c async for c in router.generate("r", PROMPT, params)])
            assert router.resumes == 1
            return plain, undisturbed, resumed
        finally:
            await engine.close()

    plain, undisturbed, resumed = asyncio.run(main())
    assert undisturbed[:5] == plain[:5] and undisturbed[5] != plain[5]  # the ban acts
    assert resumed[4:6] != plain[4:6], f"the bad word was completed across the seam: {resumed}"
    assert resumed == undisturbed
