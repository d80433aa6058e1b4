"""The JSON forms between a front end and a remote replica round-trip exactly (pure)."""

from __future__ import annotations

import json

import pytest

from headrace.engine.client import GenerateOptions, GenerationChunk
from headrace.engine.outputs import StepStats, TokenLogprobs
from headrace.request import FinishReason, SamplingParams
from headrace.router import wire


def roundtrip(data: object) -> dict:  # through real JSON text, as on the wire
    out: dict = json.loads(json.dumps(data))
    return out


def test_request_roundtrip() -> None:
    params = SamplingParams(max_tokens=7, temperature=0.5, top_k=3, seed=9, stop=("x", "yz"),
                            stop_token_ids=(2,), logprobs=2)  # fmt: skip
    options = GenerateOptions(priority=0, tenant="acme", weight=2.0, timeout_s=3.5)
    data = roundtrip(wire.request_json("r1", "m", [1, 5, 9], params, options))
    assert data["prompt_token_ids"] == [1, 5, 9]
    assert wire.params_from_json(data["params"]) == params
    assert wire.options_from_json(data["options"]) == options


def test_bad_params_are_refused() -> None:
    with pytest.raises(ValueError):
        wire.params_from_json({"max_tokens": 0})
    with pytest.raises(TypeError):
        wire.params_from_json({"bogus": 1})


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
