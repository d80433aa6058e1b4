"""Tool calling on /v1/chat/completions: the prompt's tools, the grammar, and the answer in
OpenAI's shape (`message.tool_calls`, `finish_reason: "tool_calls"`; streamed as
`delta.tool_calls`: the id and name first, then fragments of the arguments).

A call counts only once complete: `max_tokens` reached inside one ends with `length`, and the
whole answer leaves the half call out. A stream has sent that call's start and fragments by
then (as every streaming server would); its `length` says the last call is cut.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from headrace.api.errors import bad_request
from headrace.api.schemas import ChatCompletionRequest
from headrace.api.state import AppState
from headrace.api.structured import canonical, constraint_fields, grammar_for
from headrace.api.tool_grammar import ToolPlan, tool_grammar, tool_plan
from headrace.api.tool_parser import Call, CallDelta, Delta, ToolCallParser, parse_calls
from headrace.api.tool_prompt import Message, template_input
from headrace.engine.frontend.tokenizer import Tokenizer


class ChatTools:
    """One chat request's tools: `grammar()` (given to `admit`) checks them and sets `plan`."""

    def __init__(self, state: AppState, body: ChatCompletionRequest) -> None:
        self.state = state
        self.body = body
        self.plan: ToolPlan | None = None
        self.calls_first = False  # a JSON answer or calls: calls only open the answer
        self._parsers: dict[int, ToolCallParser] = {}

    def prompt(self, tokenizer: Tokenizer) -> tuple[list[Message], list[dict[str, Any]] | None]:
        """The template's messages and tools."""
        tools = list(self.body.tools or ())
        native: Callable[[], bool] = tokenizer.renders_tools
        return template_input(self.body.messages, tools, native)

    async def grammar(self) -> str | None:
        """The plan's grammar, or the constraint fields' where the plan has none."""
        self.plan = plan = tool_plan(self.body)
        if not plan.constrained:
            return await grammar_for(self.body, self.state.grammars, self._eos_banned_for())
        answer = self._answer_schema()
        self.calls_first = answer is not None and plan.mode == "auto"
        return await asyncio.to_thread(tool_grammar, plan, self.state.grammars, answer)

    def _answer_schema(self) -> dict[str, Any] | None:
        """The JSON schema of `response_format` (what a plain answer under `auto` follows; under
        `required` the answer is calls only); any other constraint field is a 400."""
        fields = constraint_fields(self.body)
        fmt = self.body.response_format
        if fields and fields != ["response_format"]:
            field = next(f for f in fields if f != "response_format")
            raise bad_request(
                f"`{field}` cannot be combined with tool calls; use response_format, or set "
                "tool_choice `none`", field,
            )  # fmt: skip
        if fmt is None or fmt.type == "text":
            return None
        schema = fmt.json_schema.json_schema if fmt.json_schema is not None else {}
        _, error = self.state.grammars.get("json", canonical(schema))
        if error:
            raise bad_request(f"`response_format` cannot be used: {error}", "response_format")
        return schema or {"type": "object"}

    @property
    def active(self) -> bool:
        """Whether the answer is read for calls."""
        return self.plan is not None and self.plan.constrained

    def message(self, text: str, reason: str) -> tuple[dict[str, Any], str]:
        """The whole answer's message and finish reason."""
        if not self.active:
            return {"role": "assistant", "content": text}, reason
        parsed = parse_calls(text, self.calls_first)
        message: dict[str, Any] = {"role": "assistant", "content": parsed.text or None}
        if parsed.calls:
            message["tool_calls"] = [_call(c) for c in parsed.calls]
        return message, _reason(reason, bool(parsed.calls))

    def deltas(self, index: int, text: str, finished: bool) -> list[dict[str, Any]]:
        """The `delta` objects of a streamed choice's new text."""
        if not self.active:
            return [{"content": text}] if text else []
        parser = self._parsers.setdefault(index, ToolCallParser(self.calls_first))
        pieces = parser.feed(text) + (parser.finish() if finished else [])
        return [_delta(p) for p in pieces]

    def reason(self, index: int, reason: str) -> str:
        parser = self._parsers.get(index)
        return _reason(reason, self.active and parser is not None and bool(parser.calls))

    def _eos_banned_for(self) -> int:
        return 0 if self.body.ignore_eos else self.body.min_tokens or 0


def _reason(reason: str, called: bool) -> str:
    return "tool_calls" if called and reason == "stop" else reason


def _call(call: Call) -> dict[str, Any]:
    return {"id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}  # fmt: skip


def _delta(piece: Delta) -> dict[str, Any]:
    if isinstance(piece, str):
        return {"content": piece}
    return {"tool_calls": [_call_delta(piece)]}


def _call_delta(piece: CallDelta) -> dict[str, Any]:
    if piece.id is not None:  # the call's start
        return {"index": piece.index, "id": piece.id, "type": "function",
                "function": {"name": piece.name, "arguments": ""}}  # fmt: skip
    return {"index": piece.index, "function": {"arguments": piece.arguments}}
