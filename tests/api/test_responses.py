"""/v1/responses through a real server with two tenants and the unmodified `openai` SDK
(`responses.create`, `responses.stream`): text, JSON schema, function calls that validate,
typed stream events assembled into the whole response, `previous_response_id` continuing a
conversation with tool results — and never another tenant's —, and 400s naming the field."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from factories import Server, make_tiny_llama, serving, tiny_server_args, write_tenants

from api.test_tools import CONTEXT, SCHEMAS, TOOLS
from headrace.gateway.auth import hash_key

ALICE, BOB = "key-alice", "key-bob"
TENANTS = f"""
tenants:
  alice: {{tier: paid, api_key_sha256: [{hash_key(ALICE)}]}}
  bob: {{tier: paid, api_key_sha256: [{hash_key(BOB)}]}}
"""
FLAT_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]
ASK = "What is the weather in Paris, and what is 2 + 3?"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("responses")
    model = make_tiny_llama(tmp / "m", max_positions=CONTEXT)
    args = tiny_server_args(model) + ["--max-model-len", str(CONTEXT)]
    args += ["--tenants", str(write_tenants(tmp, TENANTS))]
    yield from serving(args, tmp, exits=(0,))


def _sdk(server: Server, key: str = ALICE) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)


def _calls(response: Any) -> list[tuple[str, str]]:
    calls = [(o.name, o.arguments) for o in response.output if o.type == "function_call"]
    for name, arguments in calls:
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])
    return calls


def test_text_input_answers_with_usage(server: Server) -> None:
    with _sdk(server) as sdk:
        r = sdk.responses.create(model="tiny", input="Hello", max_output_tokens=8, temperature=0)
    assert r.object == "response" and r.status in ("completed", "incomplete")
    if r.status == "incomplete":
        assert r.incomplete_details is not None
        assert r.incomplete_details.reason == "max_output_tokens"
    assert isinstance(r.output_text, str)
    assert r.usage is not None and r.usage.input_tokens > 0 and 0 < r.usage.output_tokens <= 8
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens


def test_a_json_schema_text_format_holds(server: Server) -> None:
    schema = SCHEMAS["add"]
    fmt = {"type": "json_schema", "name": "sum", "schema": schema, "strict": True}
    with _sdk(server) as sdk:
        r = sdk.responses.create(
            model="tiny", input="Two numbers", text={"format": fmt}, max_output_tokens=200,  # type: ignore[typeddict-item]
            temperature=0,
        )  # fmt: skip
    assert r.status == "completed"
    jsonschema.validate(json.loads(r.output_text), schema)


def test_required_tools_stream_equals_the_whole_response(server: Server) -> None:
    body: dict[str, Any] = dict(
        model="tiny", input=ASK, tools=FLAT_TOOLS, tool_choice="required", temperature=0,
        max_output_tokens=1200,
    )  # fmt: skip
    with _sdk(server) as sdk:
        whole = sdk.responses.create(**body)
        with sdk.responses.stream(**body) as stream:
            types = [event.type for event in stream]
            streamed = stream.get_final_response()
    assert whole.status == streamed.status == "completed"
    assert _calls(whole) and _calls(whole) == _calls(streamed)
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"
    for kind in ("response.output_item.added", "response.function_call_arguments.delta",
                 "response.function_call_arguments.done", "response.output_item.done"):  # fmt: skip
        assert kind in types


def test_a_text_stream_cut_by_the_limit_ends_incomplete(server: Server) -> None:
    with (
        _sdk(server) as sdk,
        sdk.responses.stream(
            model="tiny",
            input="Hello",
            max_output_tokens=10,
            temperature=0,
        ) as stream,
    ):
        events = list(stream)
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    last = events[-1]
    # as OpenAI's: a response cut by max_output_tokens ends with response.incomplete
    assert last.type == "response.incomplete", [e.type for e in events]
    assert last.response.incomplete_details is not None
    assert last.response.incomplete_details.reason == "max_output_tokens"
    assert "".join(deltas) == last.response.output_text and deltas


def test_previous_response_id_continues_with_tool_results(server: Server) -> None:
    with _sdk(server) as sdk:
        first = sdk.responses.create(
            model="tiny", input=ASK, tools=FLAT_TOOLS, tool_choice="required",  # type: ignore[arg-type]
            parallel_tool_calls=False, temperature=0, max_output_tokens=200,
        )  # fmt: skip
        [call] = [o for o in first.output if o.type == "function_call"]
        results = [{"type": "function_call_output", "call_id": call.call_id, "output": "42"}]
        second = sdk.responses.create(
            model="tiny", input=results, previous_response_id=first.id, tools=FLAT_TOOLS,  # type: ignore[arg-type]
            tool_choice="none", max_output_tokens=5, temperature=0,
        )  # fmt: skip
    assert second.previous_response_id == first.id and second.output_text is not None
    assert first.usage is not None and second.usage is not None
    # the whole first turn (its call) and the result are in the second prompt
    assert second.usage.input_tokens > first.usage.input_tokens + 10


def test_a_tenant_never_reads_another_tenants_response(server: Server) -> None:
    with _sdk(server, ALICE) as alice:
        mine = alice.responses.create(model="tiny", input="secret", max_output_tokens=2)
    r = httpx.post(
        server.url + "/v1/responses", headers={"Authorization": f"Bearer {BOB}"}, timeout=60,
        json={"input": "go on", "previous_response_id": mine.id, "max_output_tokens": 2},
    )  # fmt: skip
    assert r.status_code == 404, r.text
    assert r.json()["error"]["param"] == "previous_response_id"
    with _sdk(server, BOB) as bob:
        with pytest.raises(openai.NotFoundError):
            bob.responses.retrieve(mine.id)
        with pytest.raises(openai.NotFoundError):
            bob.responses.delete(mine.id)
    with _sdk(server, ALICE) as alice:
        assert alice.responses.retrieve(mine.id).id == mine.id  # bob could not delete it
    unauthenticated = httpx.post(server.url + "/v1/responses", json={"input": "x"}, timeout=60)
    assert unauthenticated.status_code == 401


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
        ({"tools": [{"type": "function", "name": "f", "parameters": {"type": "objectx"}}],
          "tool_choice": "required"}, "tools.0.parameters"),
        ({"tools": FLAT_TOOLS, "tool_choice": {"type": "function", "name": "nope"}},
         "tool_choice"),
        ({"reasoning": {"effort": "high"}}, "reasoning"),
        ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nope"}}}},
         "text.format"),
        ({"previous_response_id": "resp-unknown"}, "previous_response_id"),
        ({"input": []}, "input"),
    ],
)  # fmt: skip
def test_what_cannot_be_served_is_refused_naming_the_field(
    server: Server, extra: dict[str, Any], param: str
) -> None:
    body = {"input": "x", "max_output_tokens": 2, **extra}
    r = httpx.post(
        server.url + "/v1/responses", json=body, timeout=60,
        headers={"Authorization": f"Bearer {ALICE}"},
    )  # fmt: skip
    assert r.status_code in (400, 404), r.text
    assert r.json()["error"]["param"] == param, r.text
