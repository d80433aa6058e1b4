"""One response skeleton for every generation route, a formatter per flavour.

`answer` is the stream-or-whole skeleton of /v1/generate, /v1/completions,
/v1/chat/completions and /v1/responses. Streamed: the first chunk awaited before any header (a
refusal is still a JSON error), the route's prelude, an event per chunk, its end events, then
`[DONE]`. Whole: every chunk, then the route's answer from them. `respond` is the OpenAI
routes' use of it: a flavour (completions' text and logprob offsets; chat's deltas, messages
and tool calls) only formats choices, with a usage event when `stream_options.include_usage`
asks. Admission, the run, its end and its errors are in serving.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from headrace.api.choices import Choices
from headrace.api.serving import Run, run_to_end, start_stream, stream_run
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


async def answer(
    state: AppState,
    request: Request,
    run: Run,
    *,
    stream: bool,
    event: Callable[[GenerationChunk], bytes | None],
    end: Callable[[], list[bytes]],
    whole: Callable[[list[GenerationChunk]], Json],
    prelude: Callable[[], list[bytes]] = list,
) -> Response:
    """The run streamed (`prelude()` once the first chunk is in, `event` per chunk, `end()`) or
    whole (`whole(chunks)`), with the admission's headers either way."""
    headers = run.job.admission.headers
    if stream:
        first = await start_stream(state, request, run)
        events = stream_run(run, first, event, end, prelude())
        return SSEResponse(events, headers, on_shutdown=state.shutdown.wait)
    return JSONResponse(whole(await run_to_end(state, request, run)), headers=headers)


async def respond(
    state: AppState,
    request: Request,
    run: Choices,
    flavour: Flavour,
    *,
    stream: bool,
    include_usage: bool,
) -> Response:
    extra: Json = {"usage": None} if stream and include_usage else {}

    def end() -> list[bytes]:
        if not include_usage:
            return []
        return [encode_event({**flavour.head, "choices": [], "usage": run.usage()})]

    def event(chunk: GenerationChunk) -> bytes | None:
        return flavour.event(chunk, extra)

    def whole(chunks: list[GenerationChunk]) -> Json:
        choices = [
            flavour.choice(i, [c for c in chunks if c.index == i], run.reason(i))
            for i in range(run.n)
        ]
        head = {**flavour.head, "object": flavour.whole_object, "choices": choices}
        return {**head, "usage": run.usage()}

    return await answer(
        state, request, run, stream=stream, event=event, end=end, whole=whole,
        prelude=lambda: flavour.prelude(extra),
    )  # fmt: skip
