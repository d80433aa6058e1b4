"""OpenAI-compatible /v1/completions and /v1/models (chat lives in `chat.py`)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from headrace.api.admit import admit
from headrace.api.choices import Choices
from headrace.api.logprobs import completion_logprobs
from headrace.api.prompts import check_token_ids, encode_text
from headrace.api.respond import Json, respond
from headrace.api.schemas import (
    CompletionRequest,
    CompletionResponse,
    ModelList,
    error_responses,
    streaming_response,
)
from headrace.api.sse import encode_event
from headrace.api.state import app_state
from headrace.engine.frontend.client import EngineClient, GenerationChunk
from headrace.engine.frontend.tokenizer import Tokenizer
from headrace.gateway.access import Scope

router = APIRouter()


@router.get("/v1/models", response_model=ModelList, responses=error_responses(401))
async def list_models(request: Request) -> dict[str, Any]:
    """Open on an open server; with tenants, a tenant's key or the admin key (as vLLM's
    `--api-key`). Each tenant sees every base model, and the LoRA adapters it may use (with
    `parent`); the admin key sees every adapter."""
    state = app_state(request)
    tenant = None  # the operator sees every adapter
    if not state.gateway.access.tenants or not state.gateway.access.allows(
        Scope.STATS, request.headers
    ):
        tenant = state.gateway.authenticate(request.headers)  # 401 without a tenant's key
    now = int(time.time())
    data = [
        {"id": name, "object": "model", "created": now, "owned_by": "headrace",
         "max_model_len": engine.max_model_len}
        for name, engine in state.engines.items()
    ]  # fmt: skip
    for name, base in state.visible_adapters(tenant).items():  # as vLLM lists LoRA modules
        engine = state.engines.get(base)
        if engine is not None:
            data.append(
                {"id": name, "object": "model", "created": now, "owned_by": "headrace",
                 "max_model_len": engine.max_model_len, "parent": base}
            )  # fmt: skip
    return {"object": "list", "data": data}


@router.post(
    "/v1/completions",
    response_model=CompletionResponse,
    responses={
        **streaming_response(CompletionResponse),
        **error_responses(400, 401, 404, 413, 429, 502, 503),
    },
)
async def completions(body: CompletionRequest, request: Request) -> Response:
    state = app_state(request)

    async def encode(engine: EngineClient) -> list[int]:
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            prompt = str(prompt[0])
        if isinstance(prompt, str):
            return await encode_text(engine.tokenizer, prompt)
        return check_token_ids(engine.tokenizer, [int(t) for t in prompt])

    job = await admit(
        state, request, body, encode, max_tokens=body.max_tokens, logprobs=body.logprobs,
        id_prefix="cmpl", n=body.n,
    )  # fmt: skip
    head = {"id": job.request_id, "object": "text_completion", "created": int(time.time()),
            "model": job.model}  # fmt: skip
    text = _Text(head, job.engine.tokenizer, body.logprobs, body.n)
    include_usage = body.stream_options is not None and body.stream_options.include_usage
    run = Choices(state, job, body.n)
    return await respond(state, request, run, text, stream=body.stream, include_usage=include_usage)


class _Text:
    """/v1/completions' flavour: text choices, logprobs with their text offsets."""

    whole_object = "text_completion"

    def __init__(self, head: Json, tok: Tokenizer, logprobs: int | None, n: int) -> None:
        self.head, self.tok, self.logprobs = head, tok, logprobs
        self.offsets = [0] * n  # text offset of each choice, for its logprobs

    def prelude(self, extra: Json) -> list[bytes]:
        return []

    def event(self, chunk: GenerationChunk, extra: Json) -> bytes | None:
        if not (chunk.text or chunk.finished or chunk.logprobs):
            return None
        lp = None
        if self.logprobs is not None:
            lp = completion_logprobs(self.tok, chunk.logprobs, self.offsets[chunk.index])
            self.offsets[chunk.index] += sum(len(t) for t in lp["tokens"])
        reason = str(chunk.finish_reason) if chunk.finished else None
        choice = {
            "index": chunk.index, "text": chunk.text, "logprobs": lp, "finish_reason": reason,
        }  # fmt: skip
        return encode_event({**self.head, "choices": [choice], **extra})

    def choice(self, index: int, chunks: list[GenerationChunk], reason: str) -> Json:
        logprobs = None
        if self.logprobs is not None:
            logprobs = completion_logprobs(self.tok, [lp for c in chunks for lp in c.logprobs])
        text = "".join(c.text for c in chunks)
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}
