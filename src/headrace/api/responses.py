"""OpenAI's Responses API, `POST /v1/responses`, served by the chat path: the request becomes a
chat request (`responses_input`) that is admitted, constrained and run exactly as one sent to
/v1/chat/completions — keys, tiers, limits, fair share, deadlines and cancel on disconnect
included —, and its text becomes output items (`responses_output`), whole or as typed events.

With `store` (the default) the conversation is kept per tenant (`response_store`), so that a
next request can continue it by `previous_response_id`.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from headrace.api.admit import admit
from headrace.api.chat_tools import ChatTools
from headrace.api.choices import Choices
from headrace.api.errors import APIError
from headrace.api.job import Job
from headrace.api.prompts import encode_chat
from headrace.api.respond import answer
from headrace.api.response_store import StoredResponse
from headrace.api.responses_input import (
    Message,
    chat_request,
    input_messages,
    output_message,
    responses_param,
)
from headrace.api.responses_output import ResponseOutput
from headrace.api.responses_schemas import ResponsesRequest
from headrace.api.schemas import error_responses
from headrace.api.sse import encode_typed_event
from headrace.api.state import AppState, app_state
from headrace.api.text import printable
from headrace.engine.frontend.client import EngineClient, GenerationChunk

router = APIRouter()


@router.post("/v1/responses", responses=error_responses(400, 401, 404, 413, 429, 502, 503))
async def create_response(body: ResponsesRequest, request: Request) -> Response:
    state = app_state(request)
    tenant = state.gateway.authenticate(request.headers).name
    conversation = _previous(state, tenant, body.previous_response_id) + input_messages(body)
    chat = chat_request(body, conversation)
    tools = ChatTools(state, chat)

    async def encode(engine: EngineClient) -> list[int]:
        return await encode_chat(engine.tokenizer, *tools.prompt(engine.tokenizer))

    try:
        job = await admit(
            state, request, chat, encode, max_tokens=chat.max_tokens, id_prefix="resp",
            grammar=tools.grammar,
        )  # fmt: skip
    except APIError as e:
        e.param = responses_param(e.param)
        raise
    run = Choices(state, job, 1)
    out = ResponseOutput(tools.active, tools.calls_first)
    reply = _Answer(state, body, job, run, out, tenant, conversation)
    return await _respond(state, request, body.stream, run, out, reply)


async def _respond(
    state: AppState, request: Request, stream: bool, run: Choices, out: ResponseOutput, ans: _Answer
) -> Response:
    """The answer whole, or as typed events: created, in progress, the output's, completed or
    not."""

    def prelude() -> list[bytes]:
        return [
            encode_typed_event(out.event("response.created", response=ans.snapshot())),
            encode_typed_event(out.event("response.in_progress", response=ans.snapshot())),
        ]

    def event(chunk: GenerationChunk) -> bytes | None:
        events = out.feed(chunk.text, chunk.finished)
        if chunk.finished:
            final = ans.finish()
            kind = "completed" if final["status"] == "completed" else "incomplete"
            events.append(out.event(f"response.{kind}", response=final))
        return b"".join(encode_typed_event(e) for e in events) or None

    def whole(chunks: list[GenerationChunk]) -> dict[str, Any]:
        out.feed("".join(c.text for c in chunks), finished=True)
        return ans.finish()

    return await answer(
        state, request, run, stream=stream, event=event, end=list, whole=whole, prelude=prelude
    )


@router.get("/v1/responses/{response_id}", responses=error_responses(401, 404))
async def get_response(response_id: str, request: Request) -> dict[str, Any]:
    """A stored response (`store`), the caller's own only."""
    state = app_state(request)
    stored = _stored(state, state.gateway.authenticate(request.headers).name, response_id)
    return stored.response or {}


@router.delete("/v1/responses/{response_id}", responses=error_responses(401, 404))
async def delete_response(response_id: str, request: Request) -> dict[str, Any]:
    state = app_state(request)
    if not state.responses.delete(state.gateway.authenticate(request.headers).name, response_id):
        raise _not_found(response_id, None)
    return {"id": response_id, "object": "response", "deleted": True}


def _previous(state: AppState, tenant: str, response_id: str | None) -> list[Message]:
    if response_id is None:
        return []
    return list(_stored(state, tenant, response_id, "previous_response_id").messages)


def _stored(
    state: AppState, tenant: str, response_id: str, param: str | None = None
) -> StoredResponse:
    stored = state.responses.get(tenant, response_id)
    if stored is None:  # unknown, expired, or another tenant's: the same answer
        raise _not_found(response_id, param)
    return stored


def _not_found(response_id: str, param: str | None) -> APIError:
    return APIError(
        404, f"no stored response {printable(response_id)!r}", param=param,
        code="response_not_found",
    )  # fmt: skip


class _Answer:
    """The response object of one request, in progress and final (then stored)."""

    def __init__(
        self,
        state: AppState,
        body: ResponsesRequest,
        job: Job,
        run: Choices,
        out: ResponseOutput,
        tenant: str,
        conversation: list[Message],
    ) -> None:
        self.state, self.body, self.job, self.run, self.out = state, body, job, run, out
        self.tenant = tenant
        self.conversation = conversation
        self.created_at = int(time.time())

    def snapshot(self, status: str = "in_progress") -> dict[str, Any]:
        body = self.body
        return {
            "id": self.job.request_id, "object": "response", "created_at": self.created_at,
            "status": status, "error": None, "incomplete_details": None,
            "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
            "model": self.job.model, "output": list(self.out.items),
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": body.previous_response_id, "store": body.store,
            "temperature": self.job.params.temperature, "top_p": self.job.params.top_p,
            "text": {"format": _format(body)},
            "tool_choice": _tool_choice(body), "tools": [t.model_dump() for t in body.tools or ()],
            "truncation": "disabled", "usage": None, "metadata": body.metadata or {},
        }  # fmt: skip

    def finish(self) -> dict[str, Any]:
        """The final response (stored if `store`)."""
        reason = self.run.reason(0)
        status = "completed" if reason in ("stop", "tool_calls") else "incomplete"
        final = self.snapshot(status)
        if status == "incomplete":
            final["incomplete_details"] = {
                "reason": "max_output_tokens" if reason == "length" else reason
            }
        usage = self.run.usage()
        final["usage"] = {
            "input_tokens": usage["prompt_tokens"],
            "input_tokens_details": usage["prompt_tokens_details"],
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["total_tokens"],
        }
        if self.body.store:
            answer = output_message(self.out.text, self.out.calls)
            conversation = [*self.conversation, answer]
            self.state.responses.put(self.tenant, self.job.request_id, conversation, final)
        return final


def _format(body: ResponsesRequest) -> dict[str, Any]:
    fmt = body.text.format if body.text else None
    if fmt is None or fmt.type != "json_schema":
        return {"type": fmt.type if fmt else "text"}
    return fmt.model_dump(by_alias=True, exclude_none=True)


def _tool_choice(body: ResponsesRequest) -> Any:
    choice = body.tool_choice
    if choice is None:
        return "auto" if body.tools else "none"
    return choice if isinstance(choice, str) else choice.model_dump()
