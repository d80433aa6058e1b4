"""Requests as the engine sees them: sampling settings, lifecycle status, finish reasons."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field


class FinishReason(enum.StrEnum):
    """The API's `finish_reason`. A deadline is never reported as `length`."""

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    TIMEOUT = "timeout"
    ERROR = "error"
    # Not started within its queue deadline (gateway load shedding): HTTP 503 overloaded_error.
    OVERLOADED = "overloaded"


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "finished_stopped"
    FINISHED_LENGTH = "finished_length"
    FINISHED_ABORTED = "finished_aborted"
    FINISHED_TIMEOUT = "finished_timeout"
    FINISHED_ERROR = "finished_error"
    FINISHED_OVERLOADED = "finished_overloaded"

    @property
    def is_finished(self) -> bool:
        return self in _FINISH_REASONS

    @property
    def finish_reason(self) -> FinishReason | None:
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH: FinishReason.LENGTH,
    RequestStatus.FINISHED_ABORTED: FinishReason.ABORT,
    RequestStatus.FINISHED_TIMEOUT: FinishReason.TIMEOUT,
    RequestStatus.FINISHED_ERROR: FinishReason.ERROR,
    RequestStatus.FINISHED_OVERLOADED: FinishReason.OVERLOADED,
}


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings; requests with different settings share a step."""

    max_tokens: int = 16
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 means off
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # number of top alternatives to return per token; 0 = chosen only

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise ValueError(f"logprobs must be in [0, 20], got {self.logprobs}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class Request:
    """One generation request inside an engine core.

    The scheduler schedules tokens, not phases: `num_computed_tokens` says how many of
    `all_token_ids` already have KV entries; a step hands each scheduled request some more.
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    eos_token_ids: tuple[int, ...] = ()
    priority: int = 1  # lower is more urgent (paid=0, free=1, batch=2)
    tenant: str = "default"
    weight: float = 1.0  # fair-share weight of the tenant within its priority
    arrival_time: float = field(default_factory=time.monotonic)
    deadline: float | None = None  # monotonic; past it the request ends with `timeout`
    queue_deadline: float | None = None  # monotonic; not started by then -> `overloaded`
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    num_preemptions: int = 0
    first_scheduled_time: float | None = None
    first_token_time: float | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished
