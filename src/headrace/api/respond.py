"""One response skeleton for the OpenAI routes, a formatter per flavour.

Streamed: the first chunk awaited before any header (a refusal is still a JSON error), the
flavour's prelude, an event per chunk, a usage event when `stream_options.include_usage`
asks, then `[DONE]`. Whole: every chunk, each choice formatted from its own, and the usage.
A flavour (completions' text and logprob offsets; chat's deltas, messages and tool calls)
only formats: admission, the run, its end and its errors are here and in serving.py.
"""

from __future__ import annotations

from typing import Any, Protocol

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from headrace.api.choices import Choices
from headrace.api.serving import run_to_end, start_stream, stream_run
from headrace.api.sse import SSEResponse, encode_event
from headrace.api.state import AppState
from headrace.engine.frontend.client import GenerationChunk

Json = dict[str, Any]


class Flavour(Protocol):
    head: Json  # id, object, created, model: every streamed event starts with it
    whole_object: str  # the object name of a whole (non-streamed) answer

    def prelude(self, extra: Json) -> list[bytes]:
        """Events before the first chunk's."""
        ...

    def event(self, chunk: GenerationChunk, extra: Json) -> bytes | None:
        """A chunk's event(s); None: nothing to send yet. `extra` ends each event."""
        ...

    def choice(self, index: int, chunks: list[GenerationChunk], reason: str) -> Json:
        """Choice `index` of a whole answer from its chunks."""
        ...


async def respond(
    state: AppState,
    request: Request,
    run: Choices,
    flavour: Flavour,
    *,
    stream: bool,
    include_usage: bool,
) -> Response:
    headers = run.job.admission.headers
    if stream:
        first = await start_stream(state, request, run)
        extra: Json = {"usage": None} if include_usage else {}

        def end() -> list[bytes]:
            if not include_usage:
                return []
            return [encode_event({**flavour.head, "choices": [], "usage": run.usage()})]

        def event(chunk: GenerationChunk) -> bytes | None:
            return flavour.event(chunk, extra)

        events = stream_run(run, first, event, end, flavour.prelude(extra))
        return SSEResponse(events, headers, on_shutdown=state.shutdown.wait)
    chunks = await run_to_end(state, request, run)
    choices = [
        flavour.choice(i, [c for c in chunks if c.index == i], run.reason(i)) for i in range(run.n)
    ]
    answer = {**flavour.head, "object": flavour.whole_object, "choices": choices}
    return JSONResponse({**answer, "usage": run.usage()}, headers=headers)
