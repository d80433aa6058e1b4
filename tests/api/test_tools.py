"""Tool calling on /v1/chat/completions through a real server (a tiny random-weight Llama with
the generic tool format) and the unmodified `openai` SDK: random weights under the tools'
grammar still write calls whose arguments parse and validate against their schema, a stream
assembled by the SDK equals the whole answer, and tools that cannot be used are 400s."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from factories import Server, make_tiny_llama, serving, tiny_server_args

CONTEXT = 2048
WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}
ADD: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {"type": "integer", "minimum": -999, "maximum": 999},
                "b": {"type": "integer", "minimum": -999, "maximum": 999},
            },
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, ADD]
LOOSE_WEATHER = {**WEATHER, "function": {**WEATHER["function"], "strict": None}}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris, and what is 2 + 3?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    model = make_tiny_llama(tmp_path_factory.mktemp("tools") / "m", max_positions=CONTEXT)
    args = tiny_server_args(model) + ["--max-model-len", str(CONTEXT)]
    yield from serving(args, tmp_path_factory.mktemp("tools-logs"), exits=(0,))


@pytest.fixture
def sdk(server: Server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def _chat(server: Server, **body: Any) -> dict[str, Any]:
    body = {"messages": ASK, "tools": TOOLS, "max_tokens": 400, "temperature": 0, **body}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return dict(r.json()["choices"][0])


def _valid_calls(calls: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(name, arguments) of each call, after checking it against its tool's schema."""
    out = []
    for call in calls:
        assert call["type"] == "function" and call["id"].startswith("call_")
        name, args = call["function"]["name"], json.loads(call["function"]["arguments"])
        jsonschema.validate(args, SCHEMAS[name])
        out.append((name, args))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_required_calls_parse_and_validate(server: Server, seed: int) -> None:
    choice = _chat(server, tool_choice="required", temperature=1.0, seed=seed)
    assert choice["finish_reason"] == "tool_calls", choice
    message = choice["message"]
    assert message["content"] is None
    assert 1 <= len(_valid_calls(message["tool_calls"])) <= 16
    assert len({c["id"] for c in message["tool_calls"]}) == len(message["tool_calls"])


def test_a_named_function_is_called_once(server: Server) -> None:
    named = {"type": "function", "function": {"name": "add"}}
    choice = _chat(server, tool_choice=named)
    assert choice["finish_reason"] == "tool_calls"
    [(name, args)] = _valid_calls(choice["message"]["tool_calls"])
    assert name == "add" and set(args) == {"a", "b"}


def test_without_parallel_calls_there_is_one(server: Server) -> None:
    for seed in range(3):
        choice = _chat(
            server, tool_choice="required", parallel_tool_calls=False, temperature=1.0, seed=seed
        )
        assert len(_valid_calls(choice["message"]["tool_calls"])) == 1


@pytest.mark.parametrize("seed", range(4))
def test_auto_answers_text_or_valid_calls(server: Server, seed: int) -> None:
    choice = _chat(server, tool_choice="auto", temperature=1.0, seed=seed, max_tokens=60)
    message = choice["message"]
    if message.get("tool_calls"):
        assert choice["finish_reason"] in ("tool_calls", "length")
        _valid_calls(message["tool_calls"])
    else:
        assert choice["finish_reason"] in ("stop", "length")
        assert isinstance(message["content"], str) and "<tool_call>" not in message["content"]


def test_none_answers_in_text(server: Server) -> None:
    choice = _chat(server, tool_choice="none", max_tokens=20)
    assert "tool_calls" not in choice["message"] or not choice["message"]["tool_calls"]
    assert isinstance(choice["message"]["content"], str)


def test_max_tokens_inside_a_call_is_length_and_no_half_call(server: Server) -> None:
    choice = _chat(server, tool_choice="required", max_tokens=12)
    assert choice["finish_reason"] == "length"
    assert not choice["message"].get("tool_calls")
    stream = httpx.post(
        server.url + "/v1/chat/completions", timeout=60,
        json={"messages": ASK, "tools": TOOLS, "tool_choice": "required", "max_tokens": 12,
              "temperature": 0, "stream": True},
    )  # fmt: skip
    events = [json.loads(line[6:]) for line in stream.text.splitlines()
              if line.startswith("data: {")]  # fmt: skip
    assert [e["choices"][0]["finish_reason"] for e in events][-1] == "length"


@pytest.mark.parametrize("tool_choice", ["required", "auto"])
def test_the_sdk_assembles_a_stream_equal_to_the_whole_answer(
    sdk: openai.OpenAI, tool_choice: str
) -> None:
    # Under auto greedy random weights write text to the end: `length`, which the SDK's helper
    # refuses to parse for `strict` tools, so auto is tested with the tools left loose.
    tools = TOOLS if tool_choice == "required" else [LOOSE_WEATHER, ADD]
    body: dict[str, Any] = dict(
        model="tiny", messages=ASK, tools=tools, tool_choice=tool_choice, max_tokens=1200,
        temperature=0,
    )  # fmt: skip
    whole = sdk.chat.completions.create(**body)
    with sdk.chat.completions.stream(**body) as stream:
        for _ in stream:
            pass
        streamed = stream.get_final_completion()
    a, b = whole.choices[0], streamed.choices[0]
    assert a.finish_reason == b.finish_reason
    assert a.message.content == b.message.content

    def calls(m: Any) -> list[tuple[str, str]]:
        return [(c.function.name, c.function.arguments) for c in m.tool_calls or ()]

    assert calls(a.message) == calls(b.message)
    if tool_choice == "required":
        assert a.finish_reason == "tool_calls" and calls(a.message)
    for name, arguments in calls(a.message):
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])


def test_a_conversation_with_calls_and_results_goes_on(sdk: openai.OpenAI) -> None:
    first = sdk.chat.completions.create(
        model="tiny", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=400,  # type: ignore[arg-type]
        temperature=0, parallel_tool_calls=False,
    )  # fmt: skip
    message = first.choices[0].message
    assert message.tool_calls
    history: list[Any] = [*ASK, message.model_dump(exclude_none=True)]
    history += [{"role": "tool", "tool_call_id": c.id, "content": "42"} for c in message.tool_calls]
    second = sdk.chat.completions.create(
        model="tiny", messages=history, tools=TOOLS, tool_choice="none", max_tokens=10,  # type: ignore[arg-type]
        temperature=0,
    )  # fmt: skip
    assert second.choices[0].message.content is not None
    assert second.usage is not None and first.usage is not None
    assert second.usage.prompt_tokens > first.usage.prompt_tokens  # the call and result are in


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [{"type": "code_interpreter"}]}, "tools.0.type"),
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "objectx"}}}]}, "tools.0.function.parameters"),
        ({"tools": [ADD, {"type": "function", "function": {"name": "g", "parameters": {
            "type": "array"}}}]}, "tools.1.function.parameters"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools.0.function.name"),
        ({"tools": None, "tool_choice": "required"}, "tool_choice"),
        ({"guided_regex": "[a-z]+", "tool_choice": "required"}, "guided_regex"),
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "x"}}}},
         "response_format"),
        ({"functions": [{"name": "f"}]}, "functions"),
    ],
)  # fmt: skip
def test_tools_that_cannot_be_used_are_a_400_naming_the_field(
    server: Server, extra: dict[str, Any], param: str
) -> None:
    body = {"messages": ASK, "tools": TOOLS, "max_tokens": 4, **extra}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200


@pytest.mark.parametrize("seed", range(4))
def test_auto_with_a_response_format_answers_that_json_or_calls(server: Server, seed: int) -> None:
    schema = SCHEMAS["add"]
    fmt = {"type": "json_schema", "json_schema": {"name": "sum", "schema": schema}}
    choice = _chat(server, response_format=fmt, temperature=1.0, seed=seed, max_tokens=600)
    message = choice["message"]
    if message.get("tool_calls"):
        assert choice["finish_reason"] == "tool_calls" and message["content"] is None
        _valid_calls(message["tool_calls"])
    else:
        assert choice["finish_reason"] == "stop"
        jsonschema.validate(json.loads(message["content"]), schema)
