"""A stand-in `EngineClient` for in-process tests: subclass it and write `generate`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from headrace.engine.client import GenerateOptions, GenerationChunk
from headrace.engine.messages import StepStats
from headrace.request import SamplingParams


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
        self, request_id: str, prompt: str | list[int], params: SamplingParams,
        options: GenerateOptions | None = None,
    ) -> AsyncIterator[GenerationChunk]:  # fmt: skip
        raise NotImplementedError

    async def abort(self, request_id: str) -> None:
        return None

    async def close(self) -> None:
        return None
