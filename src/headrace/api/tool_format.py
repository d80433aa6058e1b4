"""The text format of a tool call, one for every model (Hermes' and Qwen 2.5/3's):

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Several calls in one answer follow each other, separated by a newline. The name comes first so
that a stream can announce the call before its arguments; the arguments are generated under the
tool's JSON schema (`tool_grammar`), so what is written here can be parsed back without guessing
(`tool_parser`). For a chat template without a tool format, `tool_preamble` is the system text
that lists the tools and teaches this format; past calls and results are written back in it.
"""

from __future__ import annotations

import json
from typing import Any

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
# What follows CALL_OPEN up to the arguments, and what closes the call after them.
HEAD_PREFIX = '\n{"name": "'
HEAD_SUFFIX = '", "arguments": '
TAIL = "}\n" + CALL_CLOSE
SEPARATOR = "\n"  # between two calls of one answer


def call_text(name: str, arguments: str) -> str:
    """One call as the model writes it (`arguments`: JSON text)."""
    return CALL_OPEN + HEAD_PREFIX + name + HEAD_SUFFIX + _compact(arguments) + TAIL


def tool_preamble(tools: list[dict[str, Any]]) -> str:
    """The system text of the generic template: the tools as OpenAI sends them, and the format."""
    listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return (
        "You may call one or more of these tools (each with the JSON schema of its "
        f"arguments):\n<tools>\n{listed}\n</tools>\n"
        f"To call a tool, answer with one {CALL_OPEN} block per call:\n"
        + call_text("<tool name>", "{}").replace("{}}", "<arguments as JSON>}")
        + "\nEach tool's result comes back in a <tool_response> block."
    )


def tool_response_text(content: str) -> str:
    return f"<tool_response>\n{content}\n</tool_response>"


def _compact(arguments: str) -> str:
    """Arguments as the grammar writes them (`{"a": 1, "b": [2, 3]}`), if they are JSON."""
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return arguments
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
