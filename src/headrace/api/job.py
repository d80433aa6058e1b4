"""A request that passed every check (`Job`), and what a finished run of it tells those who
account for it — the trace and the ledger (`FinishedRun`; `serving.RequestRun` is one)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from headrace.engine.frontend.client import EngineClient, GenerateOptions, GenerationChunk
from headrace.gateway.base import Admission
from headrace.metrics.timing import RequestTimer
from headrace.request import FinishReason, SamplingParams


@dataclass
class Job:
    """A request that passed every check and holds a gateway admission."""

    request_id: str
    model: str
    engine: EngineClient
    prompt_ids: list[int]
    params: SamplingParams
    options: GenerateOptions
    admission: Admission
    timer: RequestTimer
    traceparent: str | None = None  # the caller's trace context, for the request's span
    key_id: str | None = None  # the caller's key, as the ledger names it
    route: str = ""
    base: str = ""  # the base model: `model` itself, or the LoRA adapter's parent
    adapter: str | None = None  # the LoRA adapter `model` names, if it names one


class FinishedRun(Protocol):
    job: Job
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    finish_reason: FinishReason | None
    replica: str | None
    last: GenerationChunk | None  # the engine's counts
    http_status: int | None  # the engine's failure as an HTTP error, if any

    @property
    def reason(self) -> str: ...
