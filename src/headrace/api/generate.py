"""POST /v1/generate: Headrace's own simple generation route.

Answer: `{id, model, text, finish_reason, usage: {prompt_tokens, completion_tokens},
timing: {queue_ms, ttft_ms, total_ms}}`. With `stream: true`: one event `{id, model, text}` per
new piece of text, then a final event that adds `finish_reason`, `usage` and `timing`, then
`data: [DONE]`.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from headrace.api.admit import admit
from headrace.api.prompts import encode_text
from headrace.api.respond import answer
from headrace.api.schemas import (
    GenerateRequest,
    GenerateResponse,
    error_responses,
    streaming_response,
)
from headrace.api.serving import RequestRun
from headrace.api.sse import encode_event
from headrace.api.state import app_state
from headrace.engine.frontend.client import EngineClient, GenerationChunk

router = APIRouter()


@router.post(
    "/v1/generate",
    response_model=GenerateResponse,
    responses={
        **streaming_response(GenerateResponse),
        **error_responses(400, 401, 404, 413, 429, 502, 503),
    },
)
async def generate(body: GenerateRequest, request: Request) -> Response:
    state = app_state(request)

    async def encode(engine: EngineClient) -> list[int]:
        return await encode_text(engine.tokenizer, body.prompt)

    job = await admit(state, request, body, encode, max_tokens=body.max_tokens, id_prefix="gen")
    run = RequestRun(state, job)
    head = {"id": job.request_id, "model": job.model}

    def event(chunk: GenerationChunk) -> bytes | None:
        return encode_event({**head, "text": chunk.text}) if chunk.text else None

    def end() -> list[bytes]:
        return [encode_event({**head, "text": "", **_tail(run)})]

    def whole(chunks: list[GenerationChunk]) -> dict[str, Any]:
        return {**head, "text": "".join(c.text for c in chunks), **_tail(run)}

    return await answer(state, request, run, stream=body.stream, event=event, end=end, whole=whole)


def _tail(run: RequestRun) -> dict[str, Any]:
    return {
        "finish_reason": str(run.finish_reason),
        "usage": {
            "prompt_tokens": run.prompt_tokens,
            "completion_tokens": run.completion_tokens,
            "cached_tokens": run.cached_tokens,
        },
        "timing": run.job.timer.as_ms(),
    }
