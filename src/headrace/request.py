"""Requests as the engine sees them: sampling settings, lifecycle status, finish reasons."""

from __future__ import annotations

import enum
import functools
import time
from dataclasses import dataclass, field

from headrace.param_checks import (
    INT32_MAX,
    check_bad_words,
    check_int,
    check_logit_bias,
    check_range,
    check_real,
)

GREEDY_BELOW_TEMPERATURE = 1e-5  # a smaller temperature samples greedily
MAX_GRAMMAR_CHARS = 1_000_000  # as the request body limit
MAX_PENALTY = 2.0  # presence and frequency penalties in [-2, 2] (OpenAI), repetition up to 2
# A positive logit is divided by the repetition penalty: near 0 that is inf, and a row of
# infinities samples NaN. 0.01 makes a logit of 30 at most 3,000.
MIN_REPETITION_PENALTY = 0.01
MAX_TOKENS_LIMIT = 1_000_000  # schema bound; the model's context is the real limit
SEED_MAX = 2**63 - 1  # a seed the API and the replica wire accept


class FinishReason(enum.StrEnum):
    """The API's `finish_reason`. A deadline is never reported as `length`."""

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    TIMEOUT = "timeout"
    ERROR = "error"
    # Not started within its queue deadline (gateway load shedding): HTTP 503 overloaded_error.
    OVERLOADED = "overloaded"


# Stands for a token a launched step samples and the host has not read yet: the input of the
# step after it, filled in on the device from the step before (--async-scheduling).
PENDING_TOKEN = -1


def prefix_salt(tenant: str, cache_salt: str | None, adapter: str | int | None) -> str:
    """Requests share cached prefix blocks only within one salt: the request's `cache_salt`,
    else its tenant's name; two adapters (or an adapter and the base model) never share KV.
    The engine salts with the adapter's load id (a reloaded adapter starts afresh), the router's
    affinity index with its name."""
    salt = tenant if cache_salt is None else cache_salt
    return salt if adapter is None or adapter == 0 else salt + lora_salt_suffix(adapter)


def lora_salt_suffix(adapter: str | int) -> str:
    """What `prefix_salt` appends for an adapter (a request re-salted to a new id swaps it)."""
    return f"\x00lora:{adapter}"


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
        return self._value_ in _FINISH_REASONS

    @property
    def finish_reason(self) -> FinishReason | None:
        return _FINISH_REASONS.get(self._value_)


# Keyed by the member's value: a str hashes in C, an Enum member through Python's
# Enum.__hash__ (asked for each request's output every step).
_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED.value: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH.value: FinishReason.LENGTH,
    RequestStatus.FINISHED_ABORTED.value: FinishReason.ABORT,
    RequestStatus.FINISHED_TIMEOUT.value: FinishReason.TIMEOUT,
    RequestStatus.FINISHED_ERROR.value: FinishReason.ERROR,
    RequestStatus.FINISHED_OVERLOADED.value: FinishReason.OVERLOADED,
}


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings; requests with different settings share a step."""

    max_tokens: int = 16
    temperature: float = 1.0  # below GREEDY_BELOW_TEMPERATURE (0 included): greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 means off
    seed: int | None = None
    # Where a seeded request's stream of draws starts: a stream resumed on another replica
    # after `k` tokens (router/resume.py) draws what the original would have drawn next.
    seed_offset: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # number of top alternatives to return per token; 0 = chosen only
    # An llguidance grammar (Lark, or its JSON form) the output must match: the front end makes
    # it from a JSON schema, a regex or choices, and checks it (headrace.api.structured).
    grammar: str | None = None
    # Logits processors (docs/api.md has the formulas); each one's default is off.
    presence_penalty: float = 0.0  # over the tokens generated so far
    frequency_penalty: float = 0.0  # over the tokens generated so far
    repetition_penalty: float = 1.0  # over prompt + generated tokens
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias) pairs, ids distinct
    min_p: float = 0.0
    min_tokens: int = 0  # EOS and stop_token_ids banned until this many tokens exist
    bad_words: tuple[tuple[int, ...], ...] = ()  # token-id sequences (tokenized by the front end)
    # The last this many prompt tokens are the request's own output of an earlier attempt (a
    # stream resumed on another replica, router/resume.py): bad_words and the presence and
    # frequency penalties count them as generated.
    prior_output_tokens: int = 0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """ValueError unless every field has its type and range (NaN and inf included), so
        that nothing poisoned reaches a core; the core calls it again on an unpickled copy."""
        check_int("max_tokens", self.max_tokens, 1, INT32_MAX)
        check_real("temperature", self.temperature)
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        check_real("top_p", self.top_p)
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        check_int("top_k", self.top_k, 0, INT32_MAX)
        if self.seed is not None:
            check_int("seed", self.seed, -(1 << 63), (1 << 64) - 1)
        check_int("seed_offset", self.seed_offset, 0, INT32_MAX)
        check_int("prior_output_tokens", self.prior_output_tokens, 0, INT32_MAX)
        if not isinstance(self.stop, tuple) or not all(isinstance(s, str) for s in self.stop):
            raise ValueError(f"stop must be a tuple of strings, got {self.stop!r}")
        if not isinstance(self.stop_token_ids, tuple):
            raise ValueError(f"stop_token_ids must be a tuple, got {self.stop_token_ids!r}")
        for t in self.stop_token_ids:
            check_int("stop_token_ids", t, 0, INT32_MAX)
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be a boolean, got {self.ignore_eos!r}")
        if self.logprobs is not None:
            check_int("logprobs", self.logprobs, 0, 20)
        if self.grammar is not None and (
            not isinstance(self.grammar, str) or not 0 < len(self.grammar) <= MAX_GRAMMAR_CHARS
        ):
            raise ValueError(f"grammar must be a string of 1 to {MAX_GRAMMAR_CHARS} characters")
        self._validate_processors()

    def _validate_processors(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            check_range(name, getattr(self, name), -MAX_PENALTY, MAX_PENALTY)
        check_real("repetition_penalty", self.repetition_penalty)
        if not MIN_REPETITION_PENALTY <= self.repetition_penalty <= MAX_PENALTY:
            raise ValueError(
                f"repetition_penalty must be in [{MIN_REPETITION_PENALTY}, {MAX_PENALTY:g}], "
                f"got {self.repetition_penalty}"
            )
        check_range("min_p", self.min_p, 0.0, 1.0)
        check_int("min_tokens", self.min_tokens, 0, self.max_tokens)
        check_logit_bias(self.logit_bias)
        check_bad_words(self.bad_words)

    @functools.cached_property  # asked for every sampled row of every step
    def processes_logits(self) -> bool:
        """True when a logits processor changes this request's logits before the choice
        (min_p only narrows a draw: it is not one of them)."""
        return (
            self.presence_penalty != 0
            or self.frequency_penalty != 0
            or self.repetition_penalty != 1
            or bool(self.logit_bias)
            or self.min_tokens > 0
            or bool(self.bad_words)
        )

    @property
    def uses_output_history(self) -> bool:
        """The processors read the tokens generated so far."""
        return (
            self.presence_penalty != 0
            or self.frequency_penalty != 0
            or self.repetition_penalty != 1
            or bool(self.bad_words)
        )

    @property
    def greedy(self) -> bool:
        # As vLLM: dividing logits by a tiny temperature overflows to inf and NaN.
        return self.temperature < GREEDY_BELOW_TEMPERATURE

    @property
    def argmax_only(self) -> bool:
        """Greedy and nothing else read from the logits: no logprobs, no grammar mask (logits
        processors aside: whether they act depends on the step, see logits_inputs)."""
        return self.greedy and self.logprobs is None and self.grammar is None


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
    lora_id: int = 0  # the runner's id of its LoRA adapter (0: the base model)
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
    draft_window: int | None = None  # drafts its next speculative step may carry (speculation)
    num_recomputed_tokens: int = 0  # KV entries preemptions threw away (computed again)
    num_draft_tokens: int = 0  # speculative tokens proposed for it, in all
    num_accepted_tokens: int = 0  # ... and accepted
    # The token a launched step samples for it, not yet read (--async-scheduling): it ends
    # output_token_ids as PENDING_TOKEN until the step lands (core/overlap.py)
    pending: bool = False

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

    def drop_pending(self) -> None:
        """Take back the placeholder of a token still in flight (the step landed, or the
        request leaves the running list before it does)."""
        if self.pending:
            self.output_token_ids.pop()
            self.pending = False
