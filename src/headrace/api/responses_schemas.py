"""The request body of /v1/responses (OpenAI's Responses API), the part Headrace serves: `input`
as text or items (messages, `function_call`, `function_call_output`), `instructions`, function
`tools`, `tool_choice`, `text.format`, `max_output_tokens`, sampling, `stream`, `store` and
`previous_response_id`. Fields it does not implement are refused by name (`ResponsesExtras`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from headrace.api.schemas import MAX_CHAT_MESSAGES, MaxTokens
from headrace.api.structured import JsonSchemaFormat
from headrace.api.text import Text
from headrace.api.tool_schemas import MAX_TOOLS, NAME_PATTERN
from headrace.api.unsupported import ResponsesExtras

_STRICT = ConfigDict(strict=True, allow_inf_nan=False, extra="forbid")
# Items replayed from an earlier response carry `id`, `status`, `annotations`...: ignored.
_REPLAYED = ConfigDict(strict=True, allow_inf_nan=False, extra="ignore")


class ContentPart(BaseModel):
    model_config = _REPLAYED

    type: Literal["input_text", "output_text", "text"]
    text: Text


class MessageItem(BaseModel):
    model_config = _REPLAYED

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: Text | list[ContentPart]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class FunctionCallItem(BaseModel):
    model_config = _REPLAYED

    type: Literal["function_call"]
    call_id: Text = Field(max_length=256)
    name: Text = Field(pattern=NAME_PATTERN)
    arguments: Text


class FunctionCallOutputItem(BaseModel):
    model_config = _REPLAYED

    type: Literal["function_call_output"]
    call_id: Text = Field(max_length=256)
    output: Text


InputItem = MessageItem | FunctionCallItem | FunctionCallOutputItem


class ResponsesFunctionTool(BaseModel):
    """The Responses API's function tool: flat, not nested under `function` as in chat."""

    model_config = _STRICT

    type: Literal["function"]
    name: Text = Field(pattern=NAME_PATTERN)
    description: Text | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ResponsesNamedTool(BaseModel):
    model_config = _STRICT

    type: Literal["function"]
    name: Text


class TextFormat(JsonSchemaFormat):
    """`text.format`: `{"type": "text"}`, `{"type": "json_object"}`, or a JSON schema with its
    `name` and `schema` beside `type` (flat, unlike chat's `response_format`)."""

    type: Literal["text", "json_object", "json_schema"]


class TextConfig(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")  # `verbosity`: ignored

    format: TextFormat | None = None


class ResponsesRequest(ResponsesExtras):
    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="forbid")

    model: Text | None = None
    input: Text | Annotated[list[InputItem], Field(min_length=1, max_length=MAX_CHAT_MESSAGES)]
    instructions: Text | None = None
    tools: list[ResponsesFunctionTool] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | ResponsesNamedTool | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    max_output_tokens: MaxTokens | None = None
    temperature: float | None = Field(None, ge=0, le=100)
    top_p: float | None = Field(None, gt=0, le=1)
    top_logprobs: Literal[0] | None = None  # logprobs: not in this API yet
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    stream: bool = False
    store: bool = Field(True, description="keep the response for previous_response_id")
    previous_response_id: Text | None = Field(None, max_length=256)
