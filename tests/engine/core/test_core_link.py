"""The ZeroMQ link to a core process under pressure (`core_link`), with tiny socket limits so
that it fills at once: a flood of requests and aborts is never dropped (every request finishes,
every abort takes effect, nothing is left running or holding KV blocks), a new request is
refused at once when too many wait, and a core whose front end reads nothing stops after its
send timeout instead of blocking for ever."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import tempfile
import time
from pathlib import Path

import zmq
from factories import FakeRunner

from headrace.config import CacheConfig, ModelConfig, SchedulerConfig
from headrace.engine.core.core_link import FRONT_END_STUCK_EXIT, CoreLink
from headrace.engine.core.core_loop import CoreSpec
from headrace.engine.core.core_proc import ProcessCore, core_process_main
from headrace.engine.frontend.async_engine import AsyncEngine
from headrace.engine.messages import EngineCoreRequest, encode
from headrace.request import FinishReason, SamplingParams

TINY = CoreLink(hwm=1, buffer_bytes=2048)
PROMPT = [(7 * i) % 97 + 1 for i in range(120)]  # ~130 bytes a request on the wire


def slow_runner(model: ModelConfig, cache: CacheConfig) -> FakeRunner:
    """Picklable (the core process builds it): steps slow enough for the inbox to fill."""
    return FakeRunner(num_kv_blocks=1024, block_size=16, max_model_len=1024, step_delay_s=0.02)


def fast_runner(model: ModelConfig, cache: CacheConfig) -> FakeRunner:
    return FakeRunner(num_kv_blocks=256, block_size=16, max_model_len=4096)


def spec(runner: object) -> CoreSpec:
    return CoreSpec(ModelConfig(), CacheConfig(), SchedulerConfig(), runner_factory=runner)  # type: ignore[arg-type]


async def run(engine: AsyncEngine, rid: str, params: SamplingParams, leave_after: int = 0):
    """The request's last chunk; with `leave_after`, the caller leaves after that many tokens."""
    got = 0
    last = None
    gen = engine.generate(rid, PROMPT, params)
    async for chunk in gen:
        last, got = chunk, got + len(chunk.token_ids)
        if leave_after and got >= leave_after:
            await gen.aclose()
            return "left"
    return last


def test_a_flood_of_requests_and_aborts_is_never_dropped(fake_tokenizer) -> None:
    n = 300
    short = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    long = SamplingParams(max_tokens=400, temperature=0, ignore_eos=True)

    async def main():
        conn = ProcessCore(spec(slow_runner), "fake", link=TINY)
        engine = await AsyncEngine.open(conn, fake_tokenizer, startup_timeout_s=60)
        try:
            # Every third is aborted at once (its abort queued behind its request), every
            # third is left by its caller after a token; the rest run to their length.
            tasks = []
            for i in range(n):
                params, leave = (short if i % 3 == 0 else long), (1 if i % 3 == 2 else 0)
                tasks.append(asyncio.create_task(run(engine, f"r{i}", params, leave)))
            await asyncio.sleep(0)  # each has sent its request
            for i in range(1, n, 3):
                await engine.abort(f"r{i}")
            held = conn.num_pending
            done, hung = await asyncio.wait(tasks, timeout=120)
            for t in hung:
                t.cancel()
            ends = [t.result() for t in done]
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and (
                engine.stats().num_running or engine.stats().kv_blocks_used
            ):
                await asyncio.sleep(0.05)
            return held, len(hung), ends, engine.stats(), conn.num_pending
        finally:
            await engine.close()

    held, hung, ends, stats, pending = asyncio.run(main())
    assert held > 0, "the test never filled the core's inbox"
    assert hung == 0, f"{hung} of {n} requests never ended"
    reasons = [e if e == "left" else e.finish_reason for e in ends]
    assert reasons.count(FinishReason.LENGTH) == n // 3
    assert reasons.count(FinishReason.ABORT) == n // 3
    assert reasons.count("left") == n // 3
    assert (stats.num_running, stats.num_waiting, stats.kv_blocks_used, pending) == (0, 0, 0, 0)


def test_a_new_request_is_refused_at_once_when_too_many_wait(fake_tokenizer) -> None:
    link = CoreLink(hwm=1, buffer_bytes=2048, pending_limit=5)
    params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)

    async def main():
        engine = await AsyncEngine.open(ProcessCore(spec(slow_runner), "fake", link=link))
        try:
            tasks = [asyncio.create_task(run(engine, f"r{i}", params)) for i in range(200)]
            return await asyncio.wait_for(asyncio.gather(*tasks), timeout=120)
        finally:
            await engine.close()

    ends = asyncio.run(main())
    refused = [e for e in ends if e.finish_reason is FinishReason.OVERLOADED]
    finished = [e for e in ends if e.finish_reason is FinishReason.LENGTH]
    assert refused and len(refused) + len(finished) == len(ends)
    assert "not taking requests" in refused[0].error


def test_a_core_whose_front_end_reads_nothing_stops(tmp_path: Path) -> None:
    """The front end here binds the core's sockets, sends one long request and never reads."""
    ctx = zmq.Context()
    inbox, outbox = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    outbox.setsockopt(zmq.RCVHWM, 1)
    outbox.setsockopt(zmq.RCVBUF, 2048)
    d = tempfile.mkdtemp(dir=tmp_path)
    inbox.bind(f"ipc://{d}/in")
    outbox.bind(f"ipc://{d}/out")
    link = CoreLink(hwm=1, buffer_bytes=2048, out_timeout_s=1.0)
    args = (spec(fast_runner), "fake", f"ipc://{d}/in", f"ipc://{d}/out", os.getpid(), link)
    proc = multiprocessing.get_context("spawn").Process(target=core_process_main, args=args)
    proc.start()
    try:
        params = SamplingParams(max_tokens=3000, temperature=0, ignore_eos=True)
        inbox.send(encode(EngineCoreRequest("r", [1, 2, 3], params)))
        proc.join(60)
        assert not proc.is_alive(), "the core blocked on its front end for 60 s"
        assert proc.exitcode == FRONT_END_STUCK_EXIT
    finally:
        if proc.is_alive():
            proc.kill()
        inbox.close(linger=0)
        outbox.close(linger=0)
        ctx.term()
