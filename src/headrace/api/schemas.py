"""Request and response bodies of the HTTP API (pydantic), also the source of /openapi.json.

Requests validate strictly (`"5"` is not a number) and refuse NaN/infinity, so a wrong type is a
400 before any work. Bounds that need the model (prompt + max_tokens within the context) are
checked later, once the prompt is tokenized.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from headrace.api.structured import StructuredFields
from headrace.api.text import Text
from headrace.api.tool_schemas import ToolCall, ToolFields
from headrace.api.unsupported import ChatExtras, CompletionExtras
from headrace.param_checks import MAX_LOGIT_BIAS, MAX_LOGIT_BIAS_ENTRIES
from headrace.request import (
    MAX_PENALTY,
    MAX_TOKENS_LIMIT,
    MIN_REPETITION_PENALTY,
    SEED_MAX,
)

MAX_N = 16  # choices of one request (`n`); each is computed, the prompt once
MAX_CHAT_MESSAGES = 2048  # as OpenAI: a longer conversation is a flood, not a chat
MAX_CALLS_IN_HISTORY = 128  # tool calls of one assistant message

_STRICT = ConfigDict(strict=True, allow_inf_nan=False)

Stop = Annotated[Text, Field(min_length=1, max_length=256)]
TokenId = Annotated[int, Field(ge=0, le=2**31 - 1)]
MaxTokens = Annotated[int, Field(ge=1, le=MAX_TOKENS_LIMIT)]
Penalty = Annotated[float, Field(ge=-MAX_PENALTY, le=MAX_PENALTY)]
# token id (a decimal string, as JSON keys are) -> bias; ids below the vocabulary: checked later
LogitBias = Annotated[
    dict[
        Annotated[str, Field(pattern=r"^[0-9]{1,10}$")],
        Annotated[float, Field(ge=-MAX_LOGIT_BIAS, le=MAX_LOGIT_BIAS)],
    ],
    Field(max_length=MAX_LOGIT_BIAS_ENTRIES),
]
MAX_BAD_WORDS = 64
BadWords = Annotated[list[Annotated[Text, Field(min_length=1, max_length=256)]], Field(
    max_length=MAX_BAD_WORDS
)]  # fmt: skip


class SamplingFields(StructuredFields):
    """Settings shared by every generation route."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="forbid")

    model: Text | None = Field(None, description="served model name; default: the first model")
    temperature: float = Field(1.0, ge=0, le=100, description="0 means greedy")
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=-1, description="0 or -1 means off")
    seed: int | None = Field(None, ge=0, le=SEED_MAX)
    stop: Stop | Annotated[list[Stop], Field(max_length=16)] | None = None
    stop_token_ids: Annotated[list[TokenId], Field(max_length=64)] | None = Field(
        None, description="token ids that end the output (as vLLM: kept in the text unless special)"
    )
    ignore_eos: bool = Field(False, description="keep generating past end-of-sequence")
    # Logits processors (docs/api.md gives each formula); null or absent: off.
    presence_penalty: Penalty | None = Field(None, description="minus this once per token seen")
    frequency_penalty: Penalty | None = Field(None, description="minus this per occurrence")
    repetition_penalty: float | None = Field(
        None,
        ge=MIN_REPETITION_PENALTY,
        le=MAX_PENALTY,
        description="prompt + output tokens: /r if > 0, else *r",
    )
    logit_bias: LogitBias | None = Field(None, description="token id -> bias added to its logit")
    min_p: float | None = Field(None, ge=0, le=1, description="drop p < min_p * max p")
    min_tokens: int | None = Field(
        None, ge=0, le=MAX_TOKENS_LIMIT, description="no EOS or stop_token_ids before this many"
    )
    bad_words: BadWords | None = Field(None, description="words never generated (as vLLM)")
    stream: bool = False
    timeout: float | None = Field(
        None, gt=0, le=86_400, description="seconds; ends with finish_reason `timeout`"
    )


class GenerateRequest(SamplingFields):
    prompt: Text = Field(min_length=1)
    max_tokens: MaxTokens = 16


class StreamOptions(BaseModel):
    model_config = _STRICT

    include_usage: bool = False


class CompletionRequest(SamplingFields, CompletionExtras):
    prompt: (
        Text
        | Annotated[list[int], Field(min_length=1)]
        | Annotated[list[Text], Field(min_length=1, max_length=1)]
    ) = Field(description="a string, a list of token ids, or a list of one string")
    max_tokens: MaxTokens = 16
    n: int = Field(1, ge=1, le=MAX_N, description=f"choices, at most {MAX_N}")
    logprobs: int | None = Field(None, ge=0, le=20)
    stream_options: StreamOptions | None = None


class TextPart(BaseModel):
    model_config = _STRICT

    type: Literal["text"]
    text: Text


class ChatMessage(BaseModel):
    # Replayed histories carry metadata (`refusal`, `annotations`, ...) that does not change
    # the prompt: ignored, unlike unknown request fields.
    model_config = ConfigDict(strict=True, extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[TextPart] | None = None
    name: Text | None = None
    tool_calls: list[ToolCall] | None = Field(None, max_length=MAX_CALLS_IN_HISTORY)
    tool_call_id: Text | None = Field(None, max_length=256)

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class ChatCompletionRequest(SamplingFields, ChatExtras, ToolFields):
    # Bounded here so that validation stops early instead of walking a 20,000-message flood.
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_CHAT_MESSAGES)
    max_tokens: MaxTokens | None = Field(None, description="default: the rest of the context")
    max_completion_tokens: MaxTokens | None = None
    n: int = Field(1, ge=1, le=MAX_N, description=f"choices, at most {MAX_N}")
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    stream_options: StreamOptions | None = None


# -- responses -------------------------------------------------------------------------------


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class PromptTokensDetails(BaseModel):
    cached_tokens: int  # prompt tokens whose KV came from the prefix cache


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class Timing(BaseModel):
    queue_ms: float | None
    ttft_ms: float | None
    total_ms: float


class GenerateUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int  # prompt tokens whose KV came from the prefix cache


class GenerateResponse(BaseModel):
    id: str
    model: str
    text: str
    finish_reason: str
    usage: GenerateUsage
    timing: Timing


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None


class CalledFunctionOut(BaseModel):
    name: str
    arguments: str  # JSON text, valid under the tool's schema


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: CalledFunctionOut


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None  # null when the answer is only tool calls
    tool_calls: list[ToolCallOut] | None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "headrace"
    max_model_len: int
    parent: str | None = None  # a LoRA adapter's base model


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# One server-sent event (OpenAPI 3.1: the schema of an event stream describes each event);
# `data` is a JSON object, or `[DONE]` at the end.
SSE_EVENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"data": {"type": "string"}, "event": {"type": "string"}},
    "required": ["data"],
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for the error statuses a route can answer."""
    return {s: {"model": ErrorResponse, "description": "error"} for s in statuses}


def streaming_response(model: type[BaseModel]) -> dict[int | str, dict[str, Any]]:
    """A 200 that is JSON, or an SSE stream when `stream` is true."""
    return {
        200: {
            "model": model,
            "content": {"text/event-stream": {"schema": SSE_EVENT_SCHEMA}},
            "description": "the result, or an event stream of `data: {json}` lines ending in "
            "`data: [DONE]` when `stream` is true",
        }
    }
