"""A request's tools as one llguidance grammar, so that a call cannot be malformed: once the
model opens a call, it can only write a given tool's name and arguments valid under that tool's
JSON schema, in `tool_format`'s format.

- `required`: the answer is one call (several with `parallel_tool_calls`, at most `MAX_CALLS`).
- a named function: one call of that tool.
- `auto`: free text, or text followed by the call marker and then calls as under `required`
  (a lazy lexeme: the marker ends the text the moment it is written).
- `none`: no grammar; the model answers in text.

Every schema is checked alone first, so that a bad one is a 400 naming its tool's field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from headrace.api.errors import bad_request
from headrace.api.grammar_cache import GrammarCache
from headrace.api.structured import JSON_OPTIONS, canonical
from headrace.api.tool_format import CALL_OPEN, HEAD_PREFIX, HEAD_SUFFIX, SEPARATOR, TAIL
from headrace.api.tool_schemas import FunctionTool, ToolFields

MAX_CALLS = 16  # calls in one answer: a model looping on calls ends here, not at max_tokens
EMPTY_OBJECT: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass(frozen=True)
class ToolPlan:
    """What a request asked of its tools: `mode` none, auto or required (a named function is
    `required` with that tool alone)."""

    tools: list[FunctionTool]
    mode: str
    parallel: bool

    @property
    def constrained(self) -> bool:
        return self.mode != "none" and bool(self.tools)


def tool_plan(fields: ToolFields) -> ToolPlan:
    """The request's plan; 400 for a `tool_choice` the tools cannot satisfy."""
    tools = list(fields.tools or ())
    names = [t.function.name for t in tools]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise bad_request(f"two tools are named `{name}`", f"tools.{i}.function.name")
    choice = fields.tool_choice
    parallel = fields.parallel_tool_calls is not False
    if choice is None or isinstance(choice, str):
        mode = choice or ("auto" if tools else "none")
        if mode == "required" and not tools:
            raise bad_request("tool_choice `required` needs `tools`", "tool_choice")
        return ToolPlan(tools, mode, parallel)
    name = choice.function.name
    named = [t for t in tools if t.function.name == name]
    if not named:
        raise bad_request(f"tool_choice names `{name}`, which is not in `tools`", "tool_choice")
    return ToolPlan(named, "required", False)


def tool_grammar(
    plan: ToolPlan, cache: GrammarCache, answer: dict[str, Any] | None = None
) -> str | None:
    """The plan's grammar (None under `none`); 400 naming the field of a schema that cannot be
    used. `answer`: the JSON schema a plain answer must follow under `auto` (a response format:
    the answer is then that JSON, or calls from its first token on). Runs in a worker thread: a
    schema takes milliseconds to compile."""
    if not plan.constrained:
        return None
    rules = [_call_rule(i, t, cache) for i, t in enumerate(plan.tools)]
    again = json.dumps(SEPARATOR + CALL_OPEN)
    more = f" ({again} call){{0,{MAX_CALLS - 1}}}" if plan.parallel else ""
    calls_only = f"{json.dumps(CALL_OPEN)} calls"
    start = "TEXT | head calls" if plan.mode == "auto" else calls_only
    if plan.mode == "auto" and answer is not None:
        start = f"answer | {calls_only}"
        rules.append(f"answer: %json {json.dumps({**answer, 'x-guidance': JSON_OPTIONS})}")
    lark = "\n".join([
        "%llguidance {}",
        f"start: {start}",
        r"TEXT: /(.|\n)*/",
        f"head[lazy]: TEXT {json.dumps(CALL_OPEN)}",
        f"calls: call{more}",
        "call: " + " | ".join(f"call_{i}" for i in range(len(plan.tools))),
        *rules,
    ])  # fmt: skip
    grammar, error = cache.get("lark", lark)
    if error:
        raise bad_request(f"the tools cannot be used together: {error}", "tools")
    return grammar


def arguments_schema(tool: FunctionTool) -> dict[str, Any]:
    """The JSON schema of a tool's arguments, always an object."""
    schema = dict(tool.function.parameters or EMPTY_OBJECT)
    schema.setdefault("type", "object")
    return schema


def _call_rule(index: int, tool: FunctionTool, cache: GrammarCache) -> str:
    field = f"tools.{index}.function.parameters"
    schema = arguments_schema(tool)
    if schema["type"] != "object":
        raise bad_request("a tool's parameters must describe a JSON object", field)
    _, error = cache.get("json", canonical(schema))
    if error:
        raise bad_request(f"`{field}` cannot be used: {error}", field)
    schema["x-guidance"] = JSON_OPTIONS  # the same JSON as response_format writes
    head = json.dumps(HEAD_PREFIX + tool.function.name + HEAD_SUFFIX)
    return f"call_{index}: {head} %json {json.dumps(schema)} {json.dumps(TAIL)}"
