"""AsyncEngine with a real core process on a tiny model: streams equal offline generation,
closing an iterator frees its blocks, a killed core ends every open stream with an error."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from headrace.config import CacheConfig, ModelConfig, SchedulerConfig
from headrace.engine.frontend.async_engine import AsyncEngine
from headrace.engine.llm import LLM
from headrace.request import FinishReason, SamplingParams

PROMPTS = ["Hello world, this is", "The quick brown fox", "numbers 12345 and", "Stop"]
GREEDY = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
LONG = SamplingParams(max_tokens=400, temperature=0, ignore_eos=True)


def _configs(model_dir):
    model = ModelConfig(model=str(model_dir), dtype="float32", device="cpu", num_threads=1)
    return model, CacheConfig(block_size=16, num_kv_blocks=64), SchedulerConfig()


async def _until(cond, timeout: float) -> float:
    start = time.monotonic()
    while not cond():
        assert time.monotonic() - start < timeout, "condition not reached in time"
        await asyncio.sleep(0.01)
    return time.monotonic() - start


async def _drain(gen):
    return [c async for c in gen]


async def _collect(engine, rid, prompt, params):
    return [c async for c in _gen(engine, rid, prompt, params)]


def _gen(engine, rid, prompt, params):
    """The engine takes token ids: a text prompt is encoded with the engine's tokenizer."""
    ids = engine.tokenizer.encode(prompt) if isinstance(prompt, str) else prompt
    return engine.generate(rid, ids, params)


@pytest.fixture(scope="module")
def offline(tiny_model_dir):
    llm = LLM(*_configs(tiny_model_dir))
    return llm.generate(PROMPTS, GREEDY)


def test_process_engine_streams_cancels_and_shuts_down(tiny_model_dir, offline):
    async def main():
        engine = await AsyncEngine.start(*_configs(tiny_model_dir), served_model_name="tiny")
        pid = engine.pid
        try:
            assert (engine.model_name, engine.max_model_len) == ("tiny", 512)
            assert engine.tokenizer.encode(PROMPTS[0]) == offline[0].prompt_token_ids
            runs = await asyncio.gather(
                *(_collect(engine, f"r{i}", p, GREEDY) for i, p in enumerate(PROMPTS))
            )
            gen = _gen(engine, "cancel-me", PROMPTS[0], LONG)
            async for chunk in gen:
                if chunk.completion_tokens >= 2:
                    break
            assert engine.stats().kv_blocks_used > 0
            await gen.aclose()
            freed = await _until(lambda: engine.stats().kv_blocks_used == 0, timeout=5.0)
            with pytest.raises(ValueError, match="maximum context length"):
                await _collect(engine, "huge", PROMPTS[0], SamplingParams(max_tokens=2000))
            # A token id the model does not have makes the runner raise inside the step.
            bad = await _collect(engine, "bad", [5, 10_000, 6], GREEDY)
            assert bad[-1].finish_reason is FinishReason.ERROR and "outside" in bad[-1].error
            again = await _collect(engine, "r0", PROMPTS[0], GREEDY)
            assert [t for c in again for t in c.token_ids] == offline[0].token_ids
            return runs, freed, engine.stats(), pid
        finally:
            await engine.close()
            assert not engine.is_healthy

    runs, freed, stats, pid = asyncio.run(main())
    for chunks, want in zip(runs, offline, strict=True):
        assert [t for c in chunks for t in c.token_ids] == want.token_ids
        assert "".join(c.text for c in chunks) == want.text
        assert chunks[-1].finish_reason is FinishReason.LENGTH
    assert freed < 2.0 and stats.num_running == 0  # a few tiny-model steps, even on busy CPUs
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the core process is gone


def test_a_killed_core_ends_open_streams_with_an_error(tiny_model_dir):
    async def main():
        engine = await AsyncEngine.start(*_configs(tiny_model_dir))
        try:
            gens = [_gen(engine, f"s{i}", PROMPTS[i], LONG) for i in range(3)]
            for g in gens:
                await anext(g)
            os.kill(engine.pid, signal.SIGKILL)
            ends = await asyncio.wait_for(asyncio.gather(*map(_drain, gens)), timeout=10)
            late = await asyncio.wait_for(_collect(engine, "late", "Hello", GREEDY), timeout=5)
            return ends, late, engine.is_healthy
        finally:
            await asyncio.wait_for(engine.close(), timeout=10)

    ends, late, healthy = asyncio.run(main())
    assert not healthy
    for chunks in ends:
        assert chunks[-1].finish_reason is FinishReason.ERROR
        assert "exited" in (chunks[-1].error or "")
    assert [c.finish_reason for c in late] == [FinishReason.ERROR]
