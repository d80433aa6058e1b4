"""AsyncEngine with its core in a thread, on the fake runner: streaming, cancellation, aborts,
failed steps, deadlines, shutdown. (Process cores and real models: test_engine_real.py.)"""

from __future__ import annotations

import asyncio
import time

import pytest

from headrace.config import CacheConfig, ModelConfig, SchedulerConfig
from headrace.engine.frontend.async_engine import AsyncEngine
from headrace.engine.frontend.client import GenerateOptions
from headrace.engine.llm import LLM
from headrace.request import FinishReason, SamplingParams

GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


async def _start(fake_runner, tokenizer, sched: SchedulerConfig | None = None, **runner_kw):
    runner = fake_runner(tokenizer=tokenizer, **runner_kw)
    engine = await AsyncEngine.start(
        ModelConfig(), CacheConfig(), sched or SchedulerConfig(),
        in_process=True, runner_factory=lambda m, c: runner, tokenizer=tokenizer,
    )  # fmt: skip
    return engine, runner


async def _collect(engine, rid, prompt, params, options=None):
    return [c async for c in _gen(engine, rid, prompt, params, options)]


def _gen(engine, rid, prompt, params, options=None):
    """The engine takes token ids: a text prompt is encoded with the engine's tokenizer."""
    ids = engine.tokenizer.encode(prompt) if isinstance(prompt, str) else prompt
    return engine.generate(rid, ids, params, options)


async def _until(cond, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


def test_streams_equal_offline_generation_and_cut_stop_strings(fake_runner, fake_tokenizer):
    prompts = ["Hello world, the quick", "Stop strings are", "numbers 12345"]
    offline = LLM(runner=fake_runner(), tokenizer=fake_tokenizer).generate(prompts, GREEDY)

    async def main():
        engine, _ = await _start(fake_runner, fake_tokenizer)
        try:
            runs = await asyncio.gather(
                *(_collect(engine, f"r{i}", p, GREEDY) for i, p in enumerate(prompts))
            )
            # A stop string taken from the middle of the greedy text cuts it exactly there.
            text = offline[0].text
            stop = text[len(text) // 2 : len(text) // 2 + 2]
            params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, stop=(stop,))
            stopped = await _collect(engine, "stop", prompts[0], params)
            await _until(lambda: engine.stats().num_running == 0)
            return runs, stopped, engine.stats()
        finally:
            await engine.close()

    runs, stopped, stats = asyncio.run(main())
    for chunks, want in zip(runs, offline, strict=True):
        assert "".join(c.text for c in chunks) == want.text
        assert [t for c in chunks for t in c.token_ids] == want.token_ids
        assert chunks[-1].finish_reason is FinishReason.LENGTH
        assert chunks[-1].completion_tokens == 12 and chunks[-1].prompt_tokens > 0
    text = offline[0].text
    assert "".join(c.text for c in stopped) == text[: text.index(text[len(text) // 2 :][:2])]
    assert stopped[-1].finish_reason is FinishReason.STOP
    assert stats.kv_blocks_used == 0


def test_closing_the_iterator_aborts_and_frees_blocks(fake_runner, fake_tokenizer):
    async def main():
        engine, runner = await _start(fake_runner, fake_tokenizer, step_delay_s=0.01)
        try:
            params = SamplingParams(max_tokens=200, ignore_eos=True)
            gen = _gen(engine, "long", "Hello world", params)
            async for chunk in gen:
                if chunk.completion_tokens >= 3:
                    break
            assert engine.stats().kv_blocks_used > 0
            steps_before = len(runner.steps)
            await gen.aclose()
            await _until(lambda: engine.stats().kv_blocks_used == 0, timeout=5.0)
            assert engine.stats().num_running == 0
            steps_after = len(runner.steps)
            # The id is free again at once.
            again = await _collect(engine, "long", "Hello", GREEDY)
            return steps_after - steps_before, again
        finally:
            await engine.close()

    steps_taken, again = asyncio.run(main())
    # Freed by the step after the abort arrived (one more may have been running then).
    assert steps_taken <= 2
    assert again[-1].finish_reason is FinishReason.LENGTH


def test_cancelling_the_consumer_task_aborts_the_request(fake_runner, fake_tokenizer):
    async def main():
        engine, _ = await _start(fake_runner, fake_tokenizer, step_delay_s=0.01)
        try:
            got = asyncio.Event()

            async def consume():
                gen = _gen(engine, "c", "Hello", SamplingParams(max_tokens=200, ignore_eos=True))
                async for _ in gen:
                    got.set()

            task = asyncio.create_task(consume())
            await got.wait()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await _until(lambda: engine.stats().kv_blocks_used == 0, timeout=1.0)
            return engine.stats().num_running, engine.num_open_requests
        finally:
            await engine.close()

    assert asyncio.run(main()) == (0, 0)


def test_abort_timeout_and_refusal(fake_runner, fake_tokenizer):
    async def main():
        engine, _ = await _start(fake_runner, fake_tokenizer, step_delay_s=0.005)
        try:
            long = SamplingParams(max_tokens=200, ignore_eos=True)
            gen = _gen(engine, "a", "Hello", long)
            first = await anext(gen)
            await engine.abort("a")
            rest = [c async for c in gen]
            timed = await _collect(engine, "t", "Hello", long, GenerateOptions(timeout_s=0.05))
            with pytest.raises(ValueError, match="maximum context length is 256 tokens"):
                await _collect(engine, "big", "Hello", SamplingParams(max_tokens=1000))
            return first, rest, timed
        finally:
            await engine.close()

    first, rest, timed = asyncio.run(main())
    assert first.finish_reason is None
    assert rest[-1].finish_reason is FinishReason.ABORT
    assert timed[-1].finish_reason is FinishReason.TIMEOUT
    assert 3 <= timed[-1].completion_tokens < 200


def test_a_failed_step_errors_its_requests_and_serving_goes_on(fake_runner, fake_tokenizer):
    poison = fake_tokenizer.encode("quick")[-1]

    def fail_when(out):
        return any(poison in s.token_ids for s in out.scheduled)

    async def main():
        engine, _ = await _start(fake_runner, fake_tokenizer, fail_when=fail_when)
        try:
            bad = await _collect(engine, "bad", "the quick fox", GREEDY)
            good = await _collect(engine, "good", "Hello world", GREEDY)
            return bad, good, engine.is_healthy, engine.stats()
        finally:
            await engine.close()

    bad, good, healthy, stats = asyncio.run(main())
    assert bad[-1].finish_reason is FinishReason.ERROR and "injected failure" in bad[-1].error
    assert good[-1].finish_reason is FinishReason.LENGTH
    assert healthy and stats.kv_blocks_used == 0


def test_stats_arrive_while_idle_and_close_ends_open_streams(fake_runner, fake_tokenizer):
    async def main():
        engine, _ = await _start(fake_runner, fake_tokenizer, step_delay_s=0.005)
        idle = engine.stats()
        await asyncio.sleep(0.6)  # an idle core reports every 0.5 s
        assert engine.stats() is not idle and engine.stats().num_running == 0
        gen = _gen(engine, "open", "Hello", SamplingParams(max_tokens=200, ignore_eos=True))
        await anext(gen)
        await engine.close()
        rest = [c async for c in gen]
        return rest, engine.is_healthy

    rest, healthy = asyncio.run(main())
    assert rest[-1].finish_reason is FinishReason.ERROR
    assert not healthy


def test_a_core_that_cannot_load_its_model_fails_start_with_the_reason(tmp_path):
    async def main():
        with pytest.raises(RuntimeError, match="no such GGUF file or model directory"):
            await AsyncEngine.start(ModelConfig(model=str(tmp_path / "missing")), in_process=True)

    asyncio.run(main())


def test_deadlines_count_from_the_http_arrival_and_bad_options_are_refused(
    fake_runner, fake_tokenizer
):
    params = SamplingParams(max_tokens=5, ignore_eos=True)

    async def main():
        engine, _ = await _start(fake_runner, fake_tokenizer)
        try:
            # Arrived 10 s ago, with 5 s to start: past its deadline before the core sees it.
            stale = GenerateOptions(queue_timeout_s=5.0, arrival_time=time.monotonic() - 10)
            late = await _collect(engine, "late", "Hello", params, stale)
            fresh = GenerateOptions(queue_timeout_s=5.0, arrival_time=time.monotonic())
            ok = await _collect(engine, "ok", "Hello", params, fresh)
            bad = GenerateOptions()
            object.__setattr__(bad, "weight", 0.0)  # past any check GenerateOptions makes
            with pytest.raises(ValueError, match="weight"):
                await _collect(engine, "w0", "Hello", params, bad)
            return late, ok, engine.num_open_requests
        finally:
            await engine.close()

    late, ok, num_open = asyncio.run(main())
    assert late[-1].finish_reason is FinishReason.OVERLOADED
    assert ok[-1].finish_reason is FinishReason.LENGTH
    assert num_open == 0  # the refused request left nothing behind
