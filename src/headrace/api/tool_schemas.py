"""Request bodies of tool calling (OpenAI's chat shape): the tools a request offers, its
`tool_choice`, and the calls an assistant message of the history carries.

Only `type: "function"` tools exist here; any other type is a 400 naming `tools.N.type`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from headrace.api.text import Text

MAX_TOOLS = 128  # as OpenAI
# As OpenAI: the name is also what the grammar writes, so it needs no escaping there.
NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"

_STRICT = ConfigDict(strict=True, allow_inf_nan=False, extra="forbid")
ToolName = Text


class FunctionDefinition(BaseModel):
    model_config = _STRICT

    name: ToolName = Field(pattern=NAME_PATTERN)
    description: Text | None = None
    parameters: dict[str, Any] | None = Field(
        None, description="JSON schema of the arguments (an object); absent: no arguments"
    )
    strict: bool | None = Field(None, description="accepted: arguments always follow the schema")


class FunctionTool(BaseModel):
    model_config = _STRICT

    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(BaseModel):
    model_config = _STRICT

    name: ToolName


class NamedToolChoice(BaseModel):
    """`{"type": "function", "function": {"name": ...}}`: exactly this tool, once."""

    model_config = _STRICT

    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class CalledFunction(BaseModel):
    # Replayed histories may carry more (`parsed_arguments`, ...): ignored.
    model_config = ConfigDict(strict=True, extra="ignore")

    name: ToolName
    arguments: Text = Field(description="the arguments, as JSON text")


class ToolCall(BaseModel):
    """A call an assistant message of the history made (OpenAI's `message.tool_calls[i]`)."""

    model_config = ConfigDict(strict=True, extra="ignore")

    id: Text = Field(max_length=256)
    type: Literal["function"] = "function"
    function: CalledFunction


class ToolFields(BaseModel):
    """The tool fields of a chat request."""

    tools: list[FunctionTool] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: ToolChoice | None = Field(
        None, description="none | auto | required | a named function; default auto with tools"
    )
    parallel_tool_calls: bool | None = Field(
        None, description="more than one call in an answer (default true)"
    )
