"""A /v1/responses request as the chat request it amounts to, so that it runs the chat path
unchanged (the gateway, tools, grammars, `Choices`): input items become chat messages after the
previous response's conversation, `instructions` a system message (not carried to the next
response, as OpenAI's), flat function tools chat's nested ones, `text.format` a
`response_format`, `max_output_tokens` `max_tokens`.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from headrace.api.errors import bad_request, describe_validation_errors
from headrace.api.responses_schemas import (
    FunctionCallItem,
    FunctionCallOutputItem,
    MessageItem,
    ResponsesRequest,
)
from headrace.api.schemas import ChatCompletionRequest

Message = dict[str, Any]


def input_messages(body: ResponsesRequest) -> list[Message]:
    """This request's input as chat messages (what is stored after the previous ones)."""
    if isinstance(body.input, str):
        return [{"role": "user", "content": body.input}]
    out: list[Message] = []
    for item in body.input:
        if isinstance(item, MessageItem):
            out.append({"role": item.role, "content": item.text()})
        elif isinstance(item, FunctionCallItem):
            _add_call(out, item)
        elif isinstance(item, FunctionCallOutputItem):
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
    return out


def chat_request(body: ResponsesRequest, conversation: list[Message]) -> ChatCompletionRequest:
    """The chat request that serves `body`, over the whole `conversation`."""
    system = [{"role": "system", "content": body.instructions}] if body.instructions else []
    chat: dict[str, Any] = {
        "model": body.model, "messages": system + conversation, "tools": _tools(body),
        "tool_choice": _tool_choice(body), "parallel_tool_calls": body.parallel_tool_calls,
        "response_format": _response_format(body), "max_tokens": body.max_output_tokens,
        "temperature": body.temperature, "top_p": body.top_p, "seed": body.seed,
    }  # fmt: skip
    try:
        return ChatCompletionRequest.model_validate(
            {k: v for k, v in chat.items() if v is not None}
        )
    except ValidationError as e:
        message, param = describe_validation_errors(e.errors())
        raise bad_request(message, responses_param(param)) from e


def responses_param(param: str | None) -> str | None:
    """A chat request's field as the Responses request names it (`tools.0.function.parameters`
    is `tools.0.parameters`, `response_format` is `text.format`)."""
    if param is None:
        return None
    head, _, rest = param.partition(".")
    if head == "tools":
        return param.replace(".function.", ".", 1)
    renamed = _RENAMED.get(head)
    return param if renamed is None else ".".join([renamed, rest]).rstrip(".")


_RENAMED = {"response_format": "text.format", "max_tokens": "max_output_tokens",
            "messages": "input"}  # fmt: skip


def output_message(text: str, calls: list[dict[str, Any]]) -> Message:
    """The assistant's answer, as the next response's history holds it."""
    message: Message = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    return message


def _add_call(out: list[Message], item: FunctionCallItem) -> None:
    """Calls join the assistant message before them (its text, or the calls beside them)."""
    call = {"id": item.call_id, "type": "function",
            "function": {"name": item.name, "arguments": item.arguments}}  # fmt: skip
    if out and out[-1]["role"] == "assistant":
        out[-1].setdefault("tool_calls", []).append(call)
    else:
        out.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _tools(body: ResponsesRequest) -> list[dict[str, Any]] | None:
    if body.tools is None:
        return None
    return [
        {"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
        for t in body.tools
    ]


def _tool_choice(body: ResponsesRequest) -> Any:
    choice = body.tool_choice
    if choice is None or isinstance(choice, str):
        return choice
    return {"type": "function", "function": {"name": choice.name}}


def _response_format(body: ResponsesRequest) -> dict[str, Any] | None:
    fmt = body.text.format if body.text else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    schema = fmt.model_dump(by_alias=True, exclude={"type"}, exclude_none=True)
    return {"type": "json_schema", "json_schema": schema}
