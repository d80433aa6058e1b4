"""The JSON forms between a front end and a remote replica round-trip exactly, and what arrives
is validated like the public API (pure)."""

from __future__ import annotations

import json
import math

import pytest

from headrace.engine.frontend.client import GenerateOptions, GenerationChunk
from headrace.engine.messages import StepStats, TokenLogprobs
from headrace.request import FinishReason, SamplingParams
from headrace.router import deadlines, wire


def roundtrip(data: object) -> dict:  # through real JSON text, as on the wire
    out: dict = json.loads(json.dumps(data))
    return out


def test_request_roundtrip() -> None:
    params = SamplingParams(max_tokens=7, temperature=0.5, top_k=3, seed=9, stop=("x", "yz"),
                            stop_token_ids=(2,), logprobs=2)  # fmt: skip
    options = GenerateOptions(priority=0, tenant="acme", weight=2.0, timeout_s=3.5, lora="support")
    data = json.loads(wire.encode_request("r1", "m", [1, 5, 9], params, options))
    assert data["prompt_token_ids"] == [1, 5, 9]
    assert wire.decode(data["params"], wire.WireParams).sampling_params() == params
    assert wire.decode(data["options"], wire.WireOptions).generate_options() == options
    body = wire.decode(data, wire.ReplicaGenerateBody)
    assert body.params.sampling_params() == params
    assert body.options.generate_options(arrival_time=5.0).arrival_time == 5.0


def test_logits_processor_fields_roundtrip() -> None:
    params = SamplingParams(
        max_tokens=9, presence_penalty=0.5, frequency_penalty=-1.25, repetition_penalty=1.1,
        logit_bias=((5, -100.0), (17, 2.5)), min_p=0.05, min_tokens=3, bad_words=((4,), (6, 7)),
    )  # fmt: skip
    data = json.loads(wire.encode_request("r1", "m", [1, 5], params, GenerateOptions()))
    assert data["params"]["logit_bias"] == {"5": -100.0, "17": 2.5}
    assert wire.decode(data["params"], wire.WireParams).sampling_params() == params
    body = wire.decode(data, wire.ReplicaGenerateBody)
    assert body.params.sampling_params() == params
    assert dict(body.params.token_ids())["params.bad_words"] == [4, 6, 7]


def test_the_wire_sends_the_time_left_not_a_clock() -> None:
    options = GenerateOptions(timeout_s=10.0, queue_timeout_s=2.0, arrival_time=100.0)
    left = deadlines.time_left(options, now=103.0)
    floor = deadlines.MIN_TIMEOUT_S
    assert (left.timeout_s, left.queue_timeout_s, left.arrival_time) == (7.0, floor, None)
    sent = json.loads(wire.encode_request("r", "m", [1], SamplingParams(), options))["options"]
    assert sent["arrival_time"] is None and 0 < sent["timeout_s"] <= 10.0
    plain = GenerateOptions(timeout_s=10.0)  # no arrival time: nothing to subtract
    assert deadlines.time_left(plain, now=1e9) is plain


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": "x"}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"logprobs": 21}, "logprobs"),
        ({"stop": ["a"] * 17}, "stop"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"ignore_eos": 1}, "ignore_eos"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": math.inf}, "frequency_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"repetition_penalty": 0.001}, "repetition_penalty"),
        ({"min_p": 1.01}, "min_p"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"logit_bias": {"x": 1.0}}, "logit_bias"),
        ({"logit_bias": {"1": -101.0}}, "logit_bias"),
        ({"logit_bias": [[1, 2.0]]}, "logit_bias"),
        ({"bad_words": [[]]}, "bad_words"),
        ({"bad_words": [[-1]]}, "bad_words"),
        ({"bad_words": [[1]] * 129}, "bad_words"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_bad_params_are_refused_naming_the_field(params: dict, field: str) -> None:
    with pytest.raises(wire.WireError) as e:
        wire.decode(params, wire.WireParams)
    assert e.value.errors()[0]["loc"][0] == field


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"weight": 0}, "weight"),
        ({"weight": -1.0}, "weight"),
        ({"weight": math.inf}, "weight"),
        ({"weight": 1001}, "weight"),
        ({"priority": 99}, "priority"),
        ({"priority": -1}, "priority"),
        ({"priority": True}, "priority"),
        ({"timeout_s": "x"}, "timeout_s"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"queue_timeout_s": math.nan}, "queue_timeout_s"),
        ({"tenant": ""}, "tenant"),
        ({"tenant": "t" * 257}, "tenant"),
        ({"arrival_time": 12.5}, "arrival_time"),  # another machine's clock
        ({"bogus": 1}, "bogus"),
    ],
)
def test_bad_options_are_refused_naming_the_field(options: dict, field: str) -> None:
    with pytest.raises(wire.WireError) as e:
        wire.decode(options, wire.WireOptions)
    assert e.value.errors()[0]["loc"][0] == field


@pytest.mark.parametrize(
    "kwargs",
    [
        {"weight": 0},
        {"weight": -2.0},
        {"weight": math.nan},
        {"weight": math.inf},
        {"weight": "1"},
        {"timeout_s": 0},
        {"timeout_s": math.nan},
        {"queue_timeout_s": -1.0},
        {"queue_timeout_s": "5"},
        {"arrival_time": math.inf},
        {"priority": 1.5},
        {"tenant": 3},
    ],
)
def test_generate_options_cannot_be_poisoned(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        GenerateOptions(**kwargs)


def test_chunk_roundtrip() -> None:
    chunk = GenerationChunk(
        "r1", "hé", [5, 6], FinishReason.LENGTH, prompt_tokens=3, completion_tokens=2,
        logprobs=[TokenLogprobs(5, -0.25, [(5, -0.25), (7, -2.0)])], queue_time=0.01,
    )  # fmt: skip
    assert wire.chunk_from_json(roundtrip(wire.chunk_json(chunk))) == chunk
    error = GenerationChunk("r2", "", [], FinishReason.ERROR, error="boom")
    assert wire.chunk_from_json(roundtrip(wire.chunk_json(error))) == error
    partial = GenerationChunk("r3", "a", [4])
    assert wire.chunk_from_json(roundtrip(wire.chunk_json(partial))) == partial


def test_stats_roundtrip() -> None:
    stats = StepStats(num_running=2, kv_blocks_used=3, waiting_by_priority=((1, 2, 30),))
    assert wire.stats_from_json(roundtrip(wire.stats_json(stats))) == stats
    assert wire.stats_from_json({"num_running": 1, "future_field": 5}).num_running == 1
