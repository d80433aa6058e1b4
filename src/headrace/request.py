"""Requests as the engine sees them: sampling settings, lifecycle status, finish reasons."""

from __future__ import annotations

import enum
import math
import time
from dataclasses import dataclass, field

GREEDY_BELOW_TEMPERATURE = 1e-5  # a smaller temperature samples greedily
_MAX_INT = (1 << 31) - 1  # counts (max_tokens, top_k, token ids) fit an int32
MAX_GRAMMAR_CHARS = 1_000_000  # as the request body limit


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
    temperature: float = 1.0  # below GREEDY_BELOW_TEMPERATURE (0 included): greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 means off
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # number of top alternatives to return per token; 0 = chosen only
    # An llguidance grammar (Lark, or its JSON form) the output must match: the front end makes
    # it from a JSON schema, a regex or choices, and checks it (headrace.api.structured).
    grammar: str | None = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """ValueError unless every field has its type and range (NaN and inf included), so
        that nothing poisoned reaches a core; the core calls it again on an unpickled copy."""
        _check_int("max_tokens", self.max_tokens, 1, _MAX_INT)
        _check_real("temperature", self.temperature)
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        _check_real("top_p", self.top_p)
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        _check_int("top_k", self.top_k, 0, _MAX_INT)
        if self.seed is not None:
            _check_int("seed", self.seed, -(1 << 63), (1 << 64) - 1)
        if not isinstance(self.stop, tuple) or not all(isinstance(s, str) for s in self.stop):
            raise ValueError(f"stop must be a tuple of strings, got {self.stop!r}")
        if not isinstance(self.stop_token_ids, tuple):
            raise ValueError(f"stop_token_ids must be a tuple, got {self.stop_token_ids!r}")
        for t in self.stop_token_ids:
            _check_int("stop_token_ids", t, 0, _MAX_INT)
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be a boolean, got {self.ignore_eos!r}")
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs, 0, 20)
        if self.grammar is not None and (
            not isinstance(self.grammar, str) or not 0 < len(self.grammar) <= MAX_GRAMMAR_CHARS
        ):
            raise ValueError(f"grammar must be a string of 1 to {MAX_GRAMMAR_CHARS} characters")

    @property
    def greedy(self) -> bool:
        # As vLLM: dividing logits by a tiny temperature overflows to inf and NaN.
        return self.temperature < GREEDY_BELOW_TEMPERATURE


def _check_int(name: str, value: object, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {value}")


def _check_real(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value}")


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
    cache_salt: str = ""  # requests share cached KV blocks only with requests of the same salt
    arrival_time: float = field(default_factory=time.monotonic)
    deadline: float | None = None  # monotonic; past it the request ends with `timeout`
    queue_deadline: float | None = None  # monotonic; not started by then -> `overloaded`
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    num_preemptions: int = 0
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache when first scheduled
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
