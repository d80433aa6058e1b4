"""The JSON forms a front end and a remote replica (another `headrace serve`) exchange, as the
front end writes and reads them.

`POST /v1/replica/generate` takes `request_json(...)` (validated on arrival by
`headrace.api.replica_schemas`) and streams one SSE event per `GenerationChunk` (`chunk_json`);
`GET /v1/stats` carries `StepStats` as `stats_json`. Token ids travel as ids, so nothing is
tokenized twice and outputs are exact.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import msgspec

from headrace.engine.frontend.client import GenerateOptions, GenerationChunk
from headrace.engine.messages import StepStats, TokenLogprobs
from headrace.request import FinishReason, SamplingParams

MIN_TIMEOUT_S = 0.001  # what is left of a deadline that ran out on the way: it ends at once


def params_json(params: SamplingParams) -> dict[str, Any]:
    """`SamplingParams` as `WireParams` reads it (logit_bias as {"token id": bias})."""
    data = dataclasses.asdict(params)
    data["logit_bias"] = {str(t): b for t, b in params.logit_bias}
    return data


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
        "params": params_json(params),
        "options": dataclasses.asdict(time_left(options)),
    }


def time_left(options: GenerateOptions, now: float | None = None) -> GenerateOptions:
    """The options with deadlines as the time left and no `arrival_time`: a monotonic clock
    means nothing on another machine."""
    if options.arrival_time is None:
        return options
    spent = max((time.monotonic() if now is None else now) - options.arrival_time, 0.0)

    def left(limit: float | None) -> float | None:
        return None if limit is None else max(limit - spent, MIN_TIMEOUT_S)

    return dataclasses.replace(
        options,
        timeout_s=left(options.timeout_s),
        queue_timeout_s=left(options.queue_timeout_s),
        arrival_time=None,
    )


def chunk_json(chunk: GenerationChunk) -> dict[str, Any]:
    data: dict[str, Any] = msgspec.to_builtins(chunk)  # the finish reason as its string
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
        cached_tokens=int(data.get("cached_tokens", 0)),
        recomputed_tokens=int(data.get("recomputed_tokens", 0)),
        draft_tokens=int(data.get("draft_tokens", 0)),
        accepted_tokens=int(data.get("accepted_tokens", 0)),
    )


def stats_json(stats: StepStats) -> dict[str, Any]:
    data: dict[str, Any] = msgspec.to_builtins(stats)
    return data


def stats_from_json(data: dict[str, Any]) -> StepStats:
    """Fields this version does not know are ignored (a newer server may send more)."""
    return msgspec.convert(data, StepStats)
