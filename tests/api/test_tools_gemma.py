"""Tool calling on the real Gemma 3 270M behind `headrace serve`, with the generic template
(Gemma's own has no tool format): 20 prompts under `required` and 20 under `auto`, every
reported call parses and validates against its tool's schema, and a conversation carrying the
calls' results goes on."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import jsonschema
import pytest
from factories import Server

pytestmark = pytest.mark.gemma

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 30},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
CONVERT = {
    "type": "function",
    "function": {
        "name": "convert_currency",
        "description": "Convert an amount of money",
        "parameters": {
            "type": "object",
            "properties": {
                "amount": {"type": "number", "minimum": 0, "maximum": 1e9},
                "from": {"type": "string", "pattern": "^[A-Z]{3}$"},
                "to": {"type": "string", "pattern": "^[A-Z]{3}$"},
            },
            "required": ["amount", "from", "to"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, CONVERT]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASKS = [
    "What's the weather in Paris?", "How much is 100 US dollars in euros?",
    "Is it cold in Oslo right now?", "Convert 2500 yen to pounds.", "Weather in Lima, please.",
    "I have 40 CHF, how many dollars is that?", "Should I take an umbrella in London?",
    "What is 15 EUR in GBP?", "Temperature in Tokyo in fahrenheit?", "Change 7 dollars to yen.",
    "How warm is it in Cairo?", "Convert 1 bitcoin worth 60000 USD to EUR.",
    "Weather for Rome and Madrid?", "Give me 300 SEK in NOK.", "Is it snowing in Denver?",
    "How many euros for 12 dollars?", "Weather in Sydney in celsius.", "Convert 99 CAD to USD.",
    "Is it sunny in Nice?", "Turn 5000 INR into USD.",
]  # fmt: skip


@pytest.fixture
def server(gemma_server: Server) -> Server:
    return gemma_server


def _chat(server: Server, ask: str, **body: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": ask}]
    body = {"messages": messages, "tools": TOOLS, "max_tokens": 160, "temperature": 0, **body}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return dict(r.json()["choices"][0])


def _validate(calls: list[dict[str, Any]]) -> None:
    for call in calls:
        fn = call["function"]
        jsonschema.validate(json.loads(fn["arguments"]), SCHEMAS[fn["name"]])


@pytest.mark.parametrize(("tool_choice", "parallel"), [("required", False), ("auto", True)])
def test_every_reported_call_validates_for_20_prompts(
    server: Server, tool_choice: str, parallel: bool
) -> None:
    def ask(a: str) -> dict[str, Any]:
        return _chat(server, a, tool_choice=tool_choice, parallel_tool_calls=parallel)

    with ThreadPoolExecutor(20) as pool:
        choices = list(pool.map(ask, ASKS))
    called = [c for c in choices if c["message"].get("tool_calls")]
    calls = [t for c in called for t in c["message"]["tool_calls"]]
    for choice in called:  # a small model may go on calling (in parallel) to max_tokens
        assert choice["finish_reason"] in ("tool_calls", "length"), choice
        _validate(choice["message"]["tool_calls"])
    print(f"{tool_choice}: {len(called)}/{len(ASKS)} answers called, {len(calls)} calls valid")
    if tool_choice == "required":
        assert len(called) == len(ASKS) and len(calls) == len(ASKS)
        assert all(c["finish_reason"] == "tool_calls" for c in choices), choices


def test_a_result_goes_back_and_the_model_answers(server: Server) -> None:
    first = _chat(server, ASKS[0], tool_choice="required", parallel_tool_calls=False)
    (call,) = first["message"]["tool_calls"]
    history = [
        {"role": "user", "content": ASKS[0]},
        first["message"],
        {"role": "tool", "tool_call_id": call["id"], "content": '{"temperature": 21}'},
    ]
    r = httpx.post(
        server.url + "/v1/chat/completions", timeout=300,
        json={"messages": history, "tools": TOOLS, "tool_choice": "none", "max_tokens": 40,
              "temperature": 0},
    )  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"]
