"""A chat request's messages and tools as the chat template's input.

A template that reads `tools` (Llama 3.x, Qwen 2.5/3, Mistral: `Tokenizer.renders_tools`) gets
them as transformers passes them: `tools` in OpenAI's shape, assistant messages with their
`tool_calls` (arguments as objects), `role: "tool"` results. Any other template (Gemma 3's, the
test models') gets the generic form, in plain turns every template accepts: a system preamble
listing the tools and the call format (`tool_format.tool_preamble`), past calls written back in
that format in the assistant's turn, and each run of tool results as one user turn of
`<tool_response>` blocks (so roles still alternate, as Gemma's template insists).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from headrace.api.schemas import ChatMessage
from headrace.api.tool_format import call_text, tool_preamble, tool_response_text
from headrace.api.tool_schemas import FunctionTool

Message = dict[str, Any]


def template_input(
    messages: list[ChatMessage], tools: list[FunctionTool], native: Callable[[], bool]
) -> tuple[list[Message], list[dict[str, Any]] | None]:
    """(messages, tools) for `apply_chat_template`; tools None where the template gets none.
    `native`: whether the template has a tool format (asked only when tools are involved)."""
    openai_tools = [t.model_dump(exclude_none=True) for t in tools]
    uses_tools = bool(tools) or any(m.tool_calls or m.role == "tool" for m in messages)
    if not uses_tools:
        return [{"role": m.role, "content": m.text()} for m in messages], None
    if native():
        return _native(messages), openai_tools or None
    return _generic(messages, openai_tools), None


def _native(messages: list[ChatMessage]) -> list[Message]:
    names = {c.id: c.function.name for m in messages for c in m.tool_calls or ()}
    out: list[Message] = []
    for m in messages:
        msg: Message = {"role": m.role, "content": m.text()}
        if m.tool_calls:
            msg["tool_calls"] = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.function.name, "arguments": _object(c.function.arguments)}}
                for c in m.tool_calls
            ]  # fmt: skip
        if m.role == "tool":
            msg["tool_call_id"] = m.tool_call_id
            name = m.name or names.get(m.tool_call_id or "")
            if name is not None:  # templates print what they are given, "None" included
                msg["name"] = name
        out.append(msg)
    return out


def _generic(messages: list[ChatMessage], tools: list[dict[str, Any]]) -> list[Message]:
    out: list[Message] = []
    for m in messages:
        if m.role == "tool":
            result = tool_response_text(m.text())
            if out and out[-1].get("tool_results"):
                out[-1]["content"] += "\n" + result
            else:
                out.append({"role": "user", "content": result, "tool_results": True})
            continue
        text = m.text()
        if m.tool_calls:
            calls = [call_text(c.function.name, c.function.arguments) for c in m.tool_calls]
            text = "\n".join(([text] if text else []) + calls)
        out.append({"role": m.role, "content": text})
    for msg in out:
        msg.pop("tool_results", None)
    if tools:
        _add_system(out, tool_preamble(tools))
    return out


def _add_system(messages: list[Message], text: str) -> None:
    """`text` in the first system turn (after what the client wrote there), or a new one."""
    if messages and messages[0]["role"] in ("system", "developer"):
        messages[0] = {**messages[0], "content": f"{messages[0]['content']}\n\n{text}".lstrip()}
    else:
        messages.insert(0, {"role": "system", "content": text})


def _object(arguments: str) -> Any:
    """Arguments as the object templates expect (`| tojson`); text that is not JSON as is."""
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments
