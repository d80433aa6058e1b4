"""The JSON forms a front end and a remote replica (another `headrace serve`) exchange.

`POST /v1/replica/generate` takes `request_json(...)` and streams one SSE event per
`GenerationChunk` (`chunk_json`); `GET /v1/stats` carries `StepStats` as `stats_json`. Token
ids travel as ids, so nothing is tokenized twice and outputs are exact.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from headrace.engine.client import GenerateOptions, GenerationChunk
from headrace.engine.outputs import StepStats, TokenLogprobs
from headrace.request import FinishReason, SamplingParams


def request_json(
    request_id: str,
    model: str,
    prompt_ids: list[int],
    params: SamplingParams,
    options: GenerateOptions,
) -> dict[str, Any]:
    return {
        "request_id": request_id,
        "model": model,
        "prompt_token_ids": prompt_ids,
        "params": dataclasses.asdict(params),
        "options": dataclasses.asdict(options),
    }


def params_from_json(data: dict[str, Any]) -> SamplingParams:
    """Raises ValueError (or TypeError) for fields that do not make valid settings."""
    data = dict(data)
    data["stop"] = tuple(data.get("stop") or ())
    data["stop_token_ids"] = tuple(data.get("stop_token_ids") or ())
    return SamplingParams(**data)


def options_from_json(data: dict[str, Any]) -> GenerateOptions:
    return GenerateOptions(**data)


def chunk_json(chunk: GenerationChunk) -> dict[str, Any]:
    data = dataclasses.asdict(chunk)
    data["finish_reason"] = str(chunk.finish_reason) if chunk.finish_reason else None
    return data


def chunk_from_json(data: dict[str, Any]) -> GenerationChunk:
    reason = data.get("finish_reason")
    return GenerationChunk(
        request_id=str(data["request_id"]),
        text=str(data.get("text", "")),
        token_ids=[int(t) for t in data.get("token_ids", [])],
        finish_reason=FinishReason(reason) if reason else None,
        prompt_tokens=int(data.get("prompt_tokens", 0)),
        completion_tokens=int(data.get("completion_tokens", 0)),
        logprobs=[
            TokenLogprobs(
                int(lp["token_id"]),
                float(lp["logprob"]),
                [(int(t), float(p)) for t, p in lp["top"]],
            )
            for lp in data.get("logprobs", [])
        ],  # fmt: skip
        error=data.get("error"),
        queue_time=data.get("queue_time"),
    )


def stats_json(stats: StepStats) -> dict[str, Any]:
    return dataclasses.asdict(stats)


def stats_from_json(data: dict[str, Any]) -> StepStats:
    names = {f.name for f in dataclasses.fields(StepStats)}
    fields = {k: v for k, v in data.items() if k in names}
    if fields.get("waiting_by_priority") is not None:
        fields["waiting_by_priority"] = tuple(tuple(x) for x in fields["waiting_by_priority"])
    return StepStats(**fields)
