"""OpenAI-compatible /v1/chat/completions: the conversation through the model's chat template."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from headrace.api.admit import admit
from headrace.api.chat_tools import ChatTools
from headrace.api.choices import Choices
from headrace.api.logprobs import chat_logprobs
from headrace.api.prompts import encode_chat
from headrace.api.schemas import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    error_responses,
    streaming_response,
)
from headrace.api.serving import run_to_end, start_stream, stream_run
from headrace.api.sse import SSEResponse, encode_event
from headrace.api.state import app_state
from headrace.engine.frontend.client import EngineClient, GenerationChunk

router = APIRouter()


@router.post(
    "/v1/chat/completions",
    response_model=ChatCompletionResponse,
    responses={
        **streaming_response(ChatCompletionResponse),
        **error_responses(400, 401, 404, 413, 429, 502, 503),
    },
)
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    state = app_state(request)
    tools = ChatTools(state, body)

    async def encode(engine: EngineClient) -> list[int]:
        return await encode_chat(engine.tokenizer, *tools.prompt(engine.tokenizer))

    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    max_tokens = body.max_completion_tokens or body.max_tokens
    job = await admit(
        state, request, body, encode, max_tokens=max_tokens, logprobs=logprobs,
        id_prefix="chatcmpl", n=body.n, grammar=tools.grammar,
    )  # fmt: skip
    run = Choices(state, job, body.n)
    tok = job.engine.tokenizer
    head = {"id": job.request_id, "object": "chat.completion.chunk", "created": int(time.time()),
            "model": job.model}  # fmt: skip
    if body.stream:
        first = await start_stream(state, request, run)
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        extra: dict[str, Any] = {"usage": None} if include_usage else {}

        def choice(index: int, delta: dict[str, Any], reason: str | None, lp: Any = None) -> bytes:
            c = {"index": index, "delta": delta, "logprobs": lp, "finish_reason": reason}
            return encode_event({**head, "choices": [c], **extra})

        def event(chunk: GenerationChunk) -> bytes | None:
            if not (chunk.text or chunk.finished or chunk.logprobs):
                return None
            lp = chat_logprobs(tok, chunk.logprobs) if logprobs is not None else None
            deltas = tools.deltas(chunk.index, chunk.text, chunk.finished)
            reason = None  # after the deltas: the last call may complete in this chunk
            if chunk.finished:
                reason = tools.reason(chunk.index, str(chunk.finish_reason))
            if not (deltas or reason or lp):
                return None  # held back (a call's head, a marker's beginning)
            deltas = deltas or [{}]
            if reason is not None and tools.active and deltas[-1]:
                deltas.append({})  # the finish reason on an event of its own, as OpenAI's
            last = len(deltas) - 1
            return b"".join(
                choice(chunk.index, d, reason if k == last else None, lp if k == 0 else None)
                for k, d in enumerate(deltas)
            )

        def end() -> list[bytes]:
            if not include_usage:
                return []
            return [encode_event({**head, "choices": [], "usage": run.usage()})]

        # With tools, no empty content: an answer of calls alone has `content: null`.
        opening = {"role": "assistant"} if tools.active else {"role": "assistant", "content": ""}
        prelude = [choice(i, opening, None) for i in range(body.n)]
        events = stream_run(run, first, event, end, prelude)
        return SSEResponse(events, job.admission.headers, on_shutdown=state.shutdown.wait)
    chunks = await run_to_end(state, request, run)
    choices = []
    for i in range(body.n):
        mine = [c for c in chunks if c.index == i]
        lp = None
        if logprobs is not None:
            lp = chat_logprobs(tok, [x for c in mine for x in c.logprobs])
        message, reason = tools.message("".join(c.text for c in mine), run.reason(i))
        choices.append({"index": i, "message": message, "logprobs": lp, "finish_reason": reason})
    answer = {**head, "object": "chat.completion", "choices": choices, "usage": run.usage()}
    return JSONResponse(answer, headers=job.admission.headers)
