"""Plain dataclasses exchanged by the engine's parts.

One step is `scheduler.schedule() -> SchedulerOutput`, `runner.execute(out) -> RunnerOutput`,
`scheduler.update(out, result) -> list[RequestOutput]`. They carry ids and `list[int]`, never
shared mutable objects, so the runner can live in another process later.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from headrace.request import FinishReason, SamplingParams


@dataclass(frozen=True)
class LogitsInputs:
    """What a request's logits processors read beyond its params. The scheduler sends it only
    with a sampling step of a request whose params process logits, and only the parts they use."""

    output_token_ids: list[int]  # generated so far; empty unless a penalty or bad_words reads it
    prompt_token_ids: list[int]  # empty unless repetition_penalty != 1
    banned_token_ids: tuple[int, ...]  # EOS and stop_token_ids while short of min_tokens


@dataclass(frozen=True)
class ScheduledRequest:
    """One request's share of a step."""

    request_id: str
    token_ids: list[int]  # tokens to compute now: a prompt chunk, or the last sampled token
    start_pos: int  # position of token_ids[0] == num_computed_tokens before this step
    block_ids: list[int]  # the request's whole block table, covering start_pos + len(token_ids)
    sample: bool  # True when this chunk reaches the end of the known tokens: sample one more
    params: SamplingParams
    num_output_tokens: int  # tokens generated so far (seeded sampling steps on this)
    logits_inputs: LogitsInputs | None = None  # None: no logits processor this step


@dataclass(frozen=True)
class SchedulerOutput:
    scheduled: list[ScheduledRequest]
    finished_ids: list[str] = field(default_factory=list)  # runner may drop their state

    @property
    def num_batched_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass(frozen=True)
class TokenLogprobs:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # (token_id, logprob) of the most likely alternatives


@dataclass(frozen=True)
class RunnerOutput:
    """Sampled tokens for the requests whose ScheduledRequest had sample=True."""

    sampled: dict[str, int]
    logprobs: dict[str, TokenLogprobs] = field(default_factory=dict)


@dataclass(frozen=True)
class RequestOutput:
    """What the engine core reports for one request after a step."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: FinishReason | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    error: str | None = None  # set with finish_reason ERROR
    queue_time: float | None = None  # arrival -> first scheduled, seconds (set once started)
    num_cached_tokens: int = 0  # prompt tokens the prefix cache held when first scheduled

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True)
class StepStats:
    """Gauges and counters after one step; exported as metrics and used by the router."""

    step_duration: float = 0.0  # seconds spent in schedule+execute+update
    num_running: int = 0
    num_waiting: int = 0
    num_batched_tokens: int = 0
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    num_preemptions_total: int = 0
    waiting_tokens: int = 0  # prompt tokens not yet computed, across waiting requests
    running_tokens: int = 0  # tokens still to compute or generate, across running requests
    # Waiting requests per priority as (priority, count, work) sorted by priority, where work is
    # the tokens still to compute and to generate (up to max_tokens): the gateway's wait
    # estimates. None when the engine does not report it.
    waiting_by_priority: tuple[tuple[int, int, int], ...] | None = None
    # Tokens computed (prefill + decode) since the engine started: throughput over wall time,
    # step overheads included, is its change over time.
    num_tokens_total: int = 0
    kv_blocks_cached: int = 0  # blocks findable by prefix (owned or parked)
    # Prompt tokens looked up in the prefix cache, and found, at each request's admission.
    prefix_cache_queries_total: int = 0
    prefix_cache_hits_total: int = 0

    @property
    def prefix_cache_hit_rate(self) -> float:
        q = self.prefix_cache_queries_total
        return self.prefix_cache_hits_total / q if q else 0.0

    @property
    def kv_usage(self) -> float:
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0
