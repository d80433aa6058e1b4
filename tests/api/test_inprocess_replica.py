"""The replica routes in process (`/v1/replica/*`, what a front end routing to this server
uses): who may call them, what reaches the engine, the stream of chunks with the engine's
stats, refusals naming the field — test_internal_routes.py asks the same of real servers."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import httpx
import pytest
from factories import chat_tokenizer
from factories.tokenizers import CHAT_TOKENIZER_CONFIG
from fake_engine import ScriptEngine, text_chunks
from gateway.test_internal_routes import WIRE_CASES, replica_body, wire_change

from api.inprocess import connect, events, make_app, request, script_engine
from api.route_coverage import covers
from headrace.engine.frontend.client import GenerateOptions, GenerationChunk
from headrace.engine.messages import StepStats
from headrace.gateway.access import InternalAccess
from headrace.gateway.auth import KeyStore, hash_key
from headrace.gateway.base import OpenGateway
from headrace.request import FinishReason, SamplingParams
from headrace.router.remote import RemoteEngine
from headrace.router.wire import chunk_json, stats_json

ADMIN = "admin-secret"
OPEN = OpenGateway(access=InternalAccess(replica_api=True))
GUARDED = OpenGateway(access=InternalAccess(KeyStore([(hash_key(ADMIN), "admin")])))
AS_ADMIN = {"authorization": f"Bearer {ADMIN}"}
GENERATE, ABORT, TOKENIZER = "/v1/replica/generate", "/v1/replica/abort", "/v1/replica/tokenizer"
REPLICA = "POST /v1/replica/generate", "POST /v1/replica/abort", "GET /v1/replica/tokenizer"


class BusyEngine(ScriptEngine):
    def stats(self) -> StepStats:
        return StepStats(num_running=2, kv_blocks_used=7, kv_blocks_total=64)


def wire_body(**changes: Any) -> dict[str, Any]:
    return replica_body(model="m", **changes)


def send(engine: ScriptEngine, path: str, gateway: OpenGateway = OPEN, **kw: Any) -> httpx.Response:
    method = "GET" if path == TOKENIZER else "POST"
    return request(make_app(engine, gateway), method, path, **kw)


@covers(*REPLICA)
def test_the_replica_api_is_off_on_an_open_server_without_replica_api() -> None:
    closed = OpenGateway()
    for path, kw in ((GENERATE, {"json": wire_body()}), (ABORT, {"json": {}}),
                     (TOKENIZER, {"params": {"model": "m"}})):  # fmt: skip
        r = send(script_engine(), path, closed, **kw)
        assert r.status_code == 404 and "--replica-api" in r.json()["error"]["message"], r.text


@covers(*REPLICA)
def test_a_guarded_server_serves_them_to_the_admin_key_only() -> None:
    requests = ((GENERATE, {"json": wire_body()}), (TOKENIZER, {"params": {"model": "m"}}),
                (ABORT, {"json": {"request_id": "x", "model": "m"}}))  # fmt: skip
    for path, kw in requests:
        for headers in ({}, {"authorization": "Bearer wrong"}):
            r = send(script_engine(), path, GUARDED, headers=headers, **kw)
            assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        assert send(script_engine(), path, GUARDED, headers=AS_ADMIN, **kw).status_code == 200
    # the key is checked before the body: a stranger learns nothing from a validation error
    bad = wire_body(options={"weight": 0})
    assert send(script_engine(), GENERATE, GUARDED, json=bad).status_code == 401


@covers("POST /v1/replica/generate")
def test_generate_streams_the_chunks_with_the_engines_stats_first_and_last() -> None:
    script = text_chunks(["a", "b", "c"], prompt_tokens=3)
    engine = BusyEngine(script, tokenizer=chat_tokenizer())
    body = wire_body(params={"seed": 9, "stop": ["x"]},
                     options={"tenant": "acme", "priority": 0, "timeout_s": 5.0})  # fmt: skip
    got = events(send(engine, GENERATE, json=body))
    stats = json.loads(json.dumps(stats_json(engine.stats())))  # as JSON carries it: lists
    sent = [chunk_json(dataclasses.replace(c, request_id="wire-1")) for c in script]
    assert got == [{**sent[0], "stats": stats}, sent[1], {**sent[2], "stats": stats}]
    (seen,) = engine.requests
    assert (seen.request_id, seen.prompt_token_ids) == ("wire-1", [1, 5, 9])
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, seed=9, stop=("x",))
    assert seen.params == params
    options = seen.options
    assert isinstance(options, GenerateOptions) and options.arrival_time is not None
    assert (options.tenant, options.priority, options.timeout_s) == ("acme", 0, 5.0)


@covers("POST /v1/replica/generate")
@pytest.mark.parametrize(("change", "field"), WIRE_CASES)
def test_a_bad_wire_value_is_a_400_naming_the_field(change: dict[str, Any], field: str) -> None:
    engine = script_engine()
    r = send(engine, GENERATE, json=wire_body(**wire_change(change, chat_tokenizer().vocab_size)))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == field and error["type"] == "invalid_request_error", error
    assert not engine.requests


@covers("POST /v1/replica/generate")
def test_engine_failures_before_and_after_the_first_chunk() -> None:
    refused = send(script_engine([ValueError("never fits")]), GENERATE, json=wire_body())
    assert (refused.status_code, refused.json()["error"]["message"]) == (400, "never fits")
    failed = send(script_engine([RuntimeError("core died")]), GENERATE, json=wire_body())
    assert failed.status_code == 503
    assert failed.json()["error"]["message"] == "the engine failed: core died"
    midway = script_engine([text_chunks(["a", "b"])[0], RuntimeError("core died")])
    got = events(send(midway, GENERATE, json=wire_body()))
    assert got[0]["text"] == "a" and (got[-1]["finish_reason"], got[-1]["error"]) == (
        "error", "core died",
    )  # fmt: skip
    down = script_engine()
    down.healthy = False
    assert send(down, GENERATE, json=wire_body()).status_code == 503 and not down.requests


@covers("POST /v1/replica/abort")
def test_abort_reaches_the_models_engine_only() -> None:
    engine = script_engine()
    r = send(engine, ABORT, json={"request_id": "r9", "model": "m"})
    assert (r.status_code, r.json(), engine.aborted) == (200, {"aborted": "r9"}, ["r9"])
    r = send(engine, ABORT, json={"request_id": "r10", "model": "other"})
    assert r.status_code == 200 and engine.aborted == ["r9"]
    r = send(engine, ABORT, json={"request_id": "r11"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"


@covers("GET /v1/replica/tokenizer")
def test_the_tokenizer_goes_to_a_front_end_that_has_no_files() -> None:
    r = send(script_engine(), TOKENIZER, params={"model": "m"})
    assert r.json() == {"tokenizer": chat_tokenizer().backend.to_str(),
                        "config": CHAT_TOKENIZER_CONFIG, "architecture": "llama"}  # fmt: skip
    assert send(script_engine(), TOKENIZER, params={"model": "x"}).status_code == 404
    stand_in = ScriptEngine([], tokenizer=object())  # no tokenizer file to send
    assert send(stand_in, TOKENIZER, params={"model": "m"}).status_code == 404
    assert send(script_engine(), TOKENIZER).status_code == 400


@covers("POST /v1/replica/generate")
def test_a_front_ends_remote_engine_gets_the_chunks_the_replica_engine_sent() -> None:
    script = text_chunks(["Hello", " there"], FinishReason.STOP, prompt_tokens=2)
    engine = script_engine(script)

    async def through_the_wire() -> list[GenerationChunk]:
        async with connect(make_app(engine, OPEN)) as client:
            remote = RemoteEngine(client, "m", 512, chat_tokenizer())
            params = SamplingParams(max_tokens=2)
            return [c async for c in remote.generate("r1", [1, 2], params)]

    chunks = asyncio.run(through_the_wire())
    assert chunks == [dataclasses.replace(c, request_id="r1") for c in script]
    assert engine.requests[0].prompt_token_ids == [1, 2]
