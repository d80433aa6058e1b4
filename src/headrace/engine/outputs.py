"""Plain typed messages exchanged by the engine's parts.

One step is `scheduler.schedule() -> SchedulerOutput`, `runner.execute(out) -> RunnerOutput`,
`scheduler.update(out, result) -> list[RequestOutput]`. They carry ids and `list[int]`, never
shared mutable objects, so the runner can live in another process later. What leaves the
core (`RequestOutput`, `StepStats`) is in `messages`.

Frozen msgspec Structs, not frozen dataclasses: a step builds one `ScheduledRequest` per
running request, and a frozen dataclass's `__init__` sets each field through
`object.__setattr__` (1.5 µs for this one's ten fields, against 0.17 µs; at 256 decoding
requests that was 0.34 ms of host time a step, bench/host_step.py).
"""

from __future__ import annotations

import msgspec

from headrace.engine.messages import TokenLogprobs
from headrace.request import SamplingParams


class LogitsInputs(msgspec.Struct, frozen=True):
    """What a request's logits processors read beyond its params. The scheduler sends it only
    with a sampling step of a request whose params process logits, and only the parts they use."""

    output_token_ids: list[int]  # generated so far; empty unless a penalty or bad_words reads it
    prompt_token_ids: list[int]  # empty unless repetition_penalty != 1
    banned_token_ids: tuple[int, ...]  # EOS and stop_token_ids while short of min_tokens


class ScheduledRequest(msgspec.Struct, frozen=True):
    """One request's share of a step."""

    request_id: str
    token_ids: list[int]  # tokens to compute now: a prompt chunk, or the last sampled token
    start_pos: int  # position of token_ids[0] == num_computed_tokens before this step
    block_ids: list[int]  # the request's whole block table, covering start_pos + len(token_ids)
    sample: bool  # True when this chunk reaches the end of the known tokens: sample one more
    params: SamplingParams
    num_output_tokens: int  # tokens generated so far (seeded sampling steps on this)
    logits_inputs: LogitsInputs | None = None  # None: no logits processor this step
    # Speculative guesses at the tokens after the last one; they end token_ids, and the
    # runner returns its greedy pick after each (speculation.py).
    draft_token_ids: list[int] = msgspec.field(default_factory=list)
    lora_id: int = 0  # the runner's id of the request's LoRA adapter; 0: the base model
    # Changes whenever block_ids changes other than by new blocks at its end (made, made again
    # after a preemption, cut after drafts): the runner keeps a table row per request and
    # writes only the new blocks while it holds (runner/block_rows.py). 0: unknown, write all.
    table_epoch: int = 0


class SchedulerOutput(msgspec.Struct, frozen=True):
    scheduled: list[ScheduledRequest]
    finished_ids: list[str] = msgspec.field(default_factory=list)  # runner may drop their state

    @property
    def num_batched_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class RunnerOutput(msgspec.Struct, frozen=True):
    """Sampled tokens for the requests whose ScheduledRequest had sample=True."""

    sampled: dict[str, int]  # the token after each request's last known token
    logprobs: dict[str, TokenLogprobs] = msgspec.field(default_factory=dict)
    # the greedy token after each draft
    draft_picks: dict[str, list[int]] = msgspec.field(default_factory=dict)
    # Requests that end in this step without a token, alone (their constraint leaves them no
    # token): `stopped` ones finish with `stop`, `errors` ones with `error` and the message.
    stopped: list[str] = msgspec.field(default_factory=list)
    errors: dict[str, str] = msgspec.field(default_factory=dict)
