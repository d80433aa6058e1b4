"""Stand-in `EngineClient`s for in-process tests (routes, router, metrics).

`FakeEngine.generate` takes the prompt as token ids only, as the real engine client does, and
checks that it got them; the chunks come from the subclass's `stream` hook (an async generator).
`ScriptEngine` replays a script of chunks for every request and records what it was asked.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from headrace.engine.frontend.client import GenerateOptions, GenerationChunk
from headrace.engine.messages import StepStats
from headrace.request import FinishReason, SamplingParams


class FakeEngine:
    model_name = "m"
    max_model_len = 64
    tokenizer: Any = None
    healthy = True

    pid = None

    @property
    def is_healthy(self) -> bool:
        return self.healthy

    @property
    def failure(self) -> str | None:
        return None if self.healthy else "the fake engine is down"

    def describe(self) -> dict[str, object]:
        return {}

    def stats(self) -> StepStats:
        return StepStats()

    def generate(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
        options: GenerateOptions | None = None,
    ) -> AsyncIterator[GenerationChunk]:  # fmt: skip
        ids = prompt_token_ids
        assert isinstance(ids, list), f"the prompt must be token ids, got {type(ids).__name__}"
        assert all(type(t) is int for t in ids), f"the prompt must be token ids, got {ids!r}"
        return self.stream(request_id, ids, params, options)

    def stream(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
        options: GenerateOptions | None,
    ) -> AsyncIterator[GenerationChunk]:  # fmt: skip
        """The request's chunks: subclasses write it as an async generator. Raising ValueError
        before the first chunk is how an engine refuses a request that can never fit."""
        raise NotImplementedError(f"{type(self).__name__} serves no requests")

    async def abort(self, request_id: str) -> None:
        return None

    async def close(self) -> None:
        return None


@dataclasses.dataclass(frozen=True)
class SeenRequest:
    """What a `ScriptEngine` was asked."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    options: GenerateOptions | None


# A script step: a chunk to send (its request id is replaced), an exception to raise, or a
# number of seconds to wait.
Step = GenerationChunk | BaseException | float
Script = Sequence[Step] | Callable[[SeenRequest], Sequence[Step]]


class ScriptEngine(FakeEngine):
    """Replays `script` (or `script(request)`) for every request. Records the requests, the
    aborts, and the ids whose stream was closed (finished or not)."""

    def __init__(
        self, script: Script, *, tokenizer: Any = None, max_model_len: int = 64,
        model_name: str = "m",
    ) -> None:  # fmt: skip
        self.script = script
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.model_name = model_name
        self.requests: list[SeenRequest] = []
        self.aborted: list[str] = []
        self.closed: list[str] = []

    async def stream(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
        options: GenerateOptions | None,
    ) -> AsyncIterator[GenerationChunk]:  # fmt: skip
        request = SeenRequest(request_id, prompt_token_ids, params, options)
        self.requests.append(request)
        steps = self.script(request) if callable(self.script) else self.script
        try:
            for step in steps:
                if isinstance(step, BaseException):
                    raise step
                if isinstance(step, GenerationChunk):
                    yield dataclasses.replace(step, request_id=request_id)
                else:
                    await asyncio.sleep(step)
        finally:
            self.closed.append(request_id)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)


def text_chunks(
    pieces: Sequence[str],
    finish: FinishReason = FinishReason.LENGTH,
    *,
    prompt_tokens: int = 0,
    first_id: int = 10,
    queue_time: float | None = 0.001,
    **last: Any,
) -> list[GenerationChunk]:
    """One chunk per piece of text, one token each (ids from `first_id`), counting completion
    tokens as an engine does; the first carries the time queued, the last says `finish` and
    takes `last`'s fields (error, cached_tokens, ...)."""
    chunks = [
        GenerationChunk(
            "", text, [first_id + i], prompt_tokens=prompt_tokens, completion_tokens=i + 1
        )
        for i, text in enumerate(pieces)
    ] or [GenerationChunk("", "", [], prompt_tokens=prompt_tokens)]
    chunks[0] = dataclasses.replace(chunks[0], queue_time=queue_time)
    chunks[-1] = dataclasses.replace(chunks[-1], finish_reason=finish, **last)
    return chunks
