"""OpenAI-compatible /v1/chat/completions: the conversation through the model's chat template."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from headrace.api.admit import admit
from headrace.api.chat_tools import ChatTools
from headrace.api.choices import Choices
from headrace.api.logprobs import chat_logprobs
from headrace.api.prompts import encode_chat
from headrace.api.respond import Json, respond
from headrace.api.schemas import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    error_responses,
    streaming_response,
)
from headrace.api.sse import encode_event
from headrace.api.state import app_state
from headrace.engine.frontend.client import EngineClient, GenerationChunk
from headrace.engine.frontend.tokenizer import Tokenizer

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
    head = {"id": job.request_id, "object": "chat.completion.chunk", "created": int(time.time()),
            "model": job.model}  # fmt: skip
    chat = _Chat(head, job.engine.tokenizer, logprobs, tools, body.n)
    include_usage = body.stream_options is not None and body.stream_options.include_usage
    run = Choices(state, job, body.n)
    return await respond(state, request, run, chat, stream=body.stream, include_usage=include_usage)


class _Chat:
    """/v1/chat/completions' flavour: an assistant message per choice, streamed as deltas,
    with tool calls where the request has tools (chat_tools.py)."""

    whole_object = "chat.completion"

    def __init__(
        self, head: Json, tok: Tokenizer, logprobs: int | None, tools: ChatTools, n: int
    ) -> None:
        self.head, self.tok, self.logprobs, self.tools, self.n = head, tok, logprobs, tools, n

    def _event(self, index: int, delta: Json, reason: str | None, lp: Any, extra: Json) -> bytes:
        c = {"index": index, "delta": delta, "logprobs": lp, "finish_reason": reason}
        return encode_event({**self.head, "choices": [c], **extra})

    def prelude(self, extra: Json) -> list[bytes]:
        # With tools, no empty content: an answer of calls alone has `content: null`.
        active = self.tools.active
        opening = {"role": "assistant"} if active else {"role": "assistant", "content": ""}
        return [self._event(i, opening, None, None, extra) for i in range(self.n)]

    def event(self, chunk: GenerationChunk, extra: Json) -> bytes | None:
        if not (chunk.text or chunk.finished or chunk.logprobs):
            return None
        lp = chat_logprobs(self.tok, chunk.logprobs) if self.logprobs is not None else None
        deltas = self.tools.deltas(chunk.index, chunk.text, chunk.finished)
        reason = None  # after the deltas: the last call may complete in this chunk
        if chunk.finished:
            reason = self.tools.reason(chunk.index, str(chunk.finish_reason))
        if not (deltas or reason or lp):
            return None  # held back (a call's head, a marker's beginning)
        deltas = deltas or [{}]
        if reason is not None and self.tools.active and deltas[-1]:
            deltas.append({})  # the finish reason on an event of its own, as OpenAI's
        last = len(deltas) - 1
        return b"".join(
            self._event(
                chunk.index, d, reason if k == last else None, lp if k == 0 else None, extra
            )
            for k, d in enumerate(deltas)
        )

    def choice(self, index: int, chunks: list[GenerationChunk], reason: str) -> Json:
        lp = None
        if self.logprobs is not None:
            lp = chat_logprobs(self.tok, [x for c in chunks for x in c.logprobs])
        message, reason = self.tools.message("".join(c.text for c in chunks), reason)
        return {"index": index, "message": message, "logprobs": lp, "finish_reason": reason}
