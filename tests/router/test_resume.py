"""A stream whose replica dies mid-way is resumed on another one (in process, fake replicas):
the caller gets the tokens and text of an undisturbed run, greedy or seeded, with usage of the
whole stream; held-back text and stop strings across the seam come out right; resumes are
bounded and refused where the state cannot be rebuilt."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import time
from collections.abc import AsyncIterator, Sequence

import pytest
from fake_engine import FakeEngine

from headrace.config import RouterConfig
from headrace.engine.frontend.client import GenerateOptions, GenerationChunk
from headrace.request import FinishReason, SamplingParams
from headrace.router.attempt import REPLICA_FAILED
from headrace.router.replica import Replica
from headrace.router.router import Router

PROMPT = [1, 2, 3]


class WordTokenizer:
    """Token i is the word `t<i>`; words are joined by spaces (as the tiny models' tokenizer)."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [int(w[1:]) for w in text.split()]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return " ".join(f"t{i}" for i in ids)


def next_token(context: list[int], params: SamplingParams, k: int) -> int:
    """A deterministic model: greedy from the context, seeded from (seed, draw number)."""
    if params.seed is None:
        return (sum(context) * 31 + len(context)) % 50 + 10
    digest = hashlib.sha256(f"{params.seed}:{params.seed_offset + k}".encode()).digest()
    return digest[0] % 50 + 10


class ModelEngine(FakeEngine):
    """Streams one token per chunk; dies (unhealthy, error chunk) after `die_after` tokens.
    `hold` tokens' text is held back (as a detokenizer or stop matcher would) and lost."""

    tokenizer = WordTokenizer()
    max_model_len = 256

    def __init__(self, die_after: int | None = None, hold: Sequence[int] = ()) -> None:
        self.die_after = die_after
        self.hold = set(hold)
        self.requests: list[tuple[list[int], SamplingParams]] = []

    async def stream(
        self, request_id: str, prompt: list[int], params: SamplingParams,
        options: GenerateOptions | None,
    ) -> AsyncIterator[GenerationChunk]:  # fmt: skip
        self.requests.append((list(prompt), params))
        context = list(prompt)
        for k in range(params.max_tokens):
            await asyncio.sleep(0)
            if self.die_after is not None and k == self.die_after:
                self.healthy = False
                yield GenerationChunk(request_id, "", [], FinishReason.ERROR, error="exited")
                return
            token = next_token(context, params, k)
            context.append(token)
            text = "" if k in self.hold else f" t{token}"
            last = k == params.max_tokens - 1
            reason = FinishReason.LENGTH if last else None
            yield GenerationChunk(
                request_id, text, [token], reason, prompt_tokens=len(prompt),
                completion_tokens=k + 1, queue_time=0.5 if prompt == PROMPT else 9.0,
            )  # fmt: skip


def run(
    engines: Sequence[ModelEngine], params: SamplingParams, config: RouterConfig | None = None
) -> tuple[Router, list[GenerationChunk]]:
    router = Router("m", [Replica(f"m/{i}", e) for i, e in enumerate(engines)], config)
    router.policy.choose = lambda candidates: candidates[0]  # type: ignore[method-assign]

    async def collect() -> list[GenerationChunk]:
        return [c async for c in router.generate("r", PROMPT, params)]

    return router, asyncio.run(collect())


def text_of(chunks: list[GenerationChunk]) -> str:
    return "".join(c.text for c in chunks)


def tokens_of(chunks: list[GenerationChunk]) -> list[int]:
    return [t for c in chunks for t in c.token_ids]


@pytest.mark.parametrize("seed", [None, 7])
def test_a_resumed_stream_equals_an_undisturbed_run(seed: int | None) -> None:
    params = SamplingParams(max_tokens=10, temperature=0.0 if seed is None else 1.0, seed=seed)
    _, reference = run([ModelEngine()], params)
    dying, other = ModelEngine(die_after=4), ModelEngine()
    router, chunks = run([dying, other], params)
    assert tokens_of(chunks) == tokens_of(reference) and len(tokens_of(chunks)) == 10
    assert text_of(chunks) == text_of(reference)
    last = chunks[-1]
    assert last.finish_reason is FinishReason.LENGTH
    assert (last.prompt_tokens, last.completion_tokens) == (len(PROMPT), 10)
    assert last.queue_time == 0.5  # the caller's wait was the first replica's
    assert last.resumed and not reference[-1].resumed  # the usage ledger records it
    assert router.resumes == 1 and router.retries == 0
    (prompt, resumed), sent = other.requests[0], tokens_of(chunks)[:4]
    assert prompt == PROMPT + sent and resumed.max_tokens == 6
    assert resumed.seed_offset == (4 if seed is not None else 0)
    assert resumed.prior_output_tokens == 4  # bad_words and penalties see the tokens sent


def test_text_the_dead_replica_held_back_is_sent_at_the_seam() -> None:
    params = SamplingParams(max_tokens=8, temperature=0.0)
    _, reference = run([ModelEngine()], params)
    router, chunks = run([ModelEngine(die_after=3, hold=[1, 2]), ModelEngine()], params)
    assert text_of(chunks) == text_of(reference)
    assert router.resumes == 1


def test_a_stop_string_across_the_seam_ends_the_stream() -> None:
    greedy = SamplingParams(max_tokens=8, temperature=0.0)
    _, reference = run([ModelEngine()], greedy)
    words = text_of(reference).split()
    stop = f"{words[2]} {words[3]}"  # the dead replica held the first word back (a partial match)
    params = dataclasses.replace(greedy, stop=(stop,))
    router, chunks = run([ModelEngine(die_after=3, hold=[2]), ModelEngine()], params)
    assert chunks[-1].finish_reason is FinishReason.STOP
    assert text_of(chunks) == " " + " ".join(words[:2]) + " "
    assert router.resumes == 1


def test_resumes_are_bounded() -> None:
    params = SamplingParams(max_tokens=10, temperature=0.0)
    engines = [ModelEngine(die_after=2), ModelEngine(die_after=2), ModelEngine()]
    router, chunks = run(engines, params, RouterConfig(max_resumes=1))
    last = chunks[-1]
    assert last.finish_reason is FinishReason.ERROR and last.error == REPLICA_FAILED
    assert (last.prompt_tokens, last.completion_tokens) == (len(PROMPT), 4)
    assert router.resumes == 1 and not engines[2].requests


def test_no_resume_with_a_grammar() -> None:
    params = SamplingParams(max_tokens=10, grammar='start: "a"')
    other = ModelEngine()
    router, chunks = run([ModelEngine(die_after=2), other], params)
    assert chunks[-1].finish_reason is FinishReason.ERROR
    assert router.resumes == 0 and not other.requests


def test_penalties_resume_counting_the_tokens_sent() -> None:
    params = SamplingParams(max_tokens=10, temperature=0.0, frequency_penalty=0.5)
    other = ModelEngine()
    router, chunks = run([ModelEngine(die_after=3), other], params)
    assert chunks[-1].finish_reason is FinishReason.LENGTH and len(tokens_of(chunks)) == 10
    assert router.resumes == 1 and other.requests[0][1].prior_output_tokens == 3


def test_a_stream_waits_for_its_only_replica_to_come_back() -> None:
    params = SamplingParams(max_tokens=6, temperature=0.0)
    _, reference = run([ModelEngine()], params)
    engine = ModelEngine(die_after=2)
    router = Router("m", [Replica("m/0", engine)], RouterConfig(resume_wait_s=5.0))

    async def restart_soon() -> None:
        await asyncio.sleep(0.2)
        engine.die_after, engine.healthy = None, True
        router.replicas[0].rejoin()

    async def collect() -> list[GenerationChunk]:
        restart = asyncio.create_task(restart_soon())
        chunks = [c async for c in router.generate("r", PROMPT, params)]
        await restart
        return chunks

    chunks = asyncio.run(collect())
    assert tokens_of(chunks) == tokens_of(reference) and router.resumes == 1


def test_a_stream_waiting_for_a_replica_ends_at_its_deadline() -> None:
    engine = ModelEngine(die_after=2)
    router = Router("m", [Replica("m/0", engine)], RouterConfig(resume_wait_s=6.0))
    params = SamplingParams(max_tokens=6, temperature=0.0)

    async def collect() -> tuple[list[GenerationChunk], float]:
        t0 = time.monotonic()
        options = GenerateOptions(timeout_s=1.0)
        chunks = [c async for c in router.generate("r", PROMPT, params, options)]
        return chunks, time.monotonic() - t0

    chunks, elapsed = asyncio.run(collect())
    assert chunks[-1].finish_reason is FinishReason.TIMEOUT and len(tokens_of(chunks)) == 2
    assert 0.9 < elapsed < 3.0, elapsed  # its 1 s timeout, not the 6 s resume wait
    assert chunks[-1].completion_tokens == 2 and not router._between


def test_an_abort_while_the_stream_waits_for_a_replica_ends_it() -> None:
    engine = ModelEngine(die_after=2)
    router = Router("m", [Replica("m/0", engine)], RouterConfig(resume_wait_s=5.0))
    params = SamplingParams(max_tokens=6, temperature=0.0)

    async def collect() -> list[GenerationChunk]:
        chunks = []
        async for chunk in router.generate("r", PROMPT, params):
            chunks.append(chunk)
            if len(chunks) == 2:  # the replica dies next: abort while the stream waits
                asyncio.get_running_loop().call_later(
                    0.2, lambda: asyncio.ensure_future(router.abort("r"))
                )
        return chunks

    t0 = asyncio.run(asyncio.wait_for(collect(), 3))
    assert t0[-1].finish_reason is FinishReason.ABORT and len(tokens_of(t0)) == 2
    assert router.resumes == 1 and not router._between
