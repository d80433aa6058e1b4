"""Tool calls in process, over a scripted engine that writes text then two calls in small
pieces (what a real model under the `auto` grammar may write, which random weights never do):
chat answers in OpenAI's shape whole and streamed, the engine got the tools' grammar, and
/v1/responses makes the same calls its output items, stored for `previous_response_id`."""

from __future__ import annotations

from typing import Any

import httpx
from fake_engine import text_chunks

from api.inprocess import events, make_app, request, script_engine, session
from api.route_coverage import covers
from headrace.api.tool_format import call_text
from headrace.request import FinishReason

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": CITY}}]
FLAT = [{"type": "function", **TOOLS[0]["function"]}]
TEXT = "Let me check. "
WRITTEN = (
    TEXT + call_text("get_weather", '{"city": "Paris"}') + "\n"
    + call_text("get_weather", '{"city": "Ro}me"}')
)  # fmt: skip
ARGS = ['{"city": "Paris"}', '{"city": "Ro}me"}']


def _engine() -> Any:
    pieces = [WRITTEN[i : i + 3] for i in range(0, len(WRITTEN), 3)]
    return script_engine(text_chunks(pieces, FinishReason.STOP), max_model_len=4096)


def _chat(**extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "weather?"}], "tools": TOOLS, **extra}


@covers("POST /v1/chat/completions")
def test_chat_reads_text_and_calls_whole_and_streamed() -> None:
    engine = _engine()
    answer = request(engine, "POST", "/v1/chat/completions", json=_chat()).json()
    (choice,) = answer["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == TEXT
    calls = choice["message"]["tool_calls"]
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        ("get_weather", a) for a in ARGS
    ]
    assert engine.requests[0].params.grammar  # auto: the tools' grammar went to the engine

    got = events(request(_engine(), "POST", "/v1/chat/completions", json=_chat(stream=True)))
    deltas = [e["choices"][0]["delta"] for e in got]
    assert deltas[0] == {"role": "assistant"}
    assert "".join(d.get("content", "") for d in deltas) == TEXT
    parts = [t for d in deltas for t in d.get("tool_calls", [])]
    starts = [p for p in parts if "id" in p]
    named = [(p["index"], p["function"]["name"]) for p in starts]
    assert named == [(0, "get_weather"), (1, "get_weather")]
    for i, args in enumerate(ARGS):
        assert "".join(p["function"]["arguments"] for p in parts if p["index"] == i) == args
    assert got[-1]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None,
                                     "finish_reason": "tool_calls"}  # fmt: skip


@covers("POST /v1/chat/completions")
def test_a_lone_call_completed_by_the_last_chunk_ends_with_tool_calls() -> None:
    written = call_text("get_weather", '{"city": "Oslo"}')
    engine = script_engine(text_chunks([written[:-4], written[-4:]], FinishReason.STOP))
    got = events(request(engine, "POST", "/v1/chat/completions", json=_chat(stream=True)))
    assert got[-1]["choices"][0]["finish_reason"] == "tool_calls"


@covers("POST /v1/chat/completions")
def test_tool_choice_none_sends_no_grammar_and_answers_text() -> None:
    engine = _engine()
    answer = request(engine, "POST", "/v1/chat/completions", json=_chat(tool_choice="none"))
    assert answer.json()["choices"][0]["message"]["content"] == WRITTEN
    assert engine.requests[0].params.grammar is None


@covers("POST /v1/responses")
def test_responses_output_items_streamed_and_stored() -> None:
    app = make_app(_engine())

    async def work(client: httpx.AsyncClient) -> tuple[Any, Any, Any]:
        body = {"input": "weather?", "tools": FLAT}
        whole = (await client.post("/v1/responses", json=body)).json()
        streamed = await client.post("/v1/responses", json={**body, "stream": True})
        follow = {"input": [{"type": "function_call_output", "call_id": "x", "output": "sun"}],
                  "previous_response_id": whole["id"], "tools": FLAT}  # fmt: skip
        after = await client.post("/v1/responses", json=follow)
        return whole, events(streamed), after

    whole, got, after = session(app, work)
    assert whole["status"] == "completed"
    assert [o["type"] for o in whole["output"]] == ["message", "function_call", "function_call"]
    assert whole["output"][0]["content"][0]["text"] == TEXT
    assert [o["arguments"] for o in whole["output"][1:]] == ARGS
    types = [e["type"] for e in got]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"
    assert [e["sequence_number"] for e in got] == list(range(len(got)))
    final = got[-1]["response"]
    assert [o["type"] for o in final["output"]] == [o["type"] for o in whole["output"]]
    assert after.status_code == 200, after.text


@covers("POST /v1/responses")
def test_a_call_cut_by_the_limit_is_closed_incomplete_and_left_out() -> None:
    cut = WRITTEN[: len(WRITTEN) - 8]  # the second call's arguments are not closed
    engine = script_engine(text_chunks([cut[:40], cut[40:]]), max_model_len=4096)
    body = {"input": "weather?", "tools": FLAT, "stream": True}
    got = events(request(engine, "POST", "/v1/responses", json=body))
    final = got[-1]
    assert final["type"] == "response.incomplete"
    assert final["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert [o["type"] for o in final["response"]["output"]] == ["message", "function_call"]
    done = [e["item"] for e in got if e["type"] == "response.output_item.done"]
    assert [d["status"] for d in done] == ["completed", "completed", "incomplete"]


@covers("POST /v1/chat/completions")
def test_n_choices_each_read_their_own_calls() -> None:
    engine = _engine()
    answer = request(engine, "POST", "/v1/chat/completions", json=_chat(n=2, seed=1)).json()
    assert [len(c["message"]["tool_calls"]) for c in answer["choices"]] == [2, 2]
    got = events(request(_engine(), "POST", "/v1/chat/completions", json=_chat(n=2, stream=True)))
    for index in (0, 1):
        parts = [t for e in got for c in e["choices"] if c["index"] == index
                 for t in c["delta"].get("tool_calls", [])]  # fmt: skip
        assert "".join(p["function"]["arguments"] for p in parts if p["index"] == 1) == ARGS[1]


@covers(
    "POST /v1/responses", "GET /v1/responses/{response_id}", "DELETE /v1/responses/{response_id}"
)
def test_a_stored_response_is_retrieved_and_deleted() -> None:
    app = make_app(_engine())

    async def work(client: httpx.AsyncClient) -> list[httpx.Response]:
        made = (await client.post("/v1/responses", json={"input": "hi", "tools": FLAT})).json()
        unstored = await client.post("/v1/responses", json={"input": "hi", "store": False})
        path = "/v1/responses/" + made["id"]
        return [
            await client.get(path), await client.delete(path), await client.get(path),
            await client.delete(path), await client.get("/v1/responses/" + unstored.json()["id"]),
        ]  # fmt: skip

    got, deleted, gone, again, unstored = session(app, work)
    assert got.status_code == 200 and got.json()["output"][1]["type"] == "function_call"
    assert deleted.json() == {"id": got.json()["id"], "object": "response", "deleted": True}
    assert [r.status_code for r in (gone, again, unstored)] == [404, 404, 404]
