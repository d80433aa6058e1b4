"""The engine client: all that the HTTP layer and the router know of an engine.

`add` is `generate(...)`: it returns an async iterator of `GenerationChunk`; `abort` ends a
request; closing or cancelling the iterator (client gone) aborts the request too.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from headrace.engine.frontend.tokenizer import Tokenizer
from headrace.engine.messages import EngineCoreRequest, StepStats, TokenLogprobs
from headrace.request import FinishReason, SamplingParams


@dataclass(frozen=True)
class GenerationChunk:
    """New text for one request since the previous chunk (stop strings already cut)."""

    request_id: str
    text: str
    token_ids: list[int]
    finish_reason: FinishReason | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    error: str | None = None
    queue_time: float | None = None  # seconds from arrival to first scheduled step
    cached_tokens: int = 0  # prompt tokens found in the prefix cache (set once started)
    index: int = 0  # which of the request's `n` choices (set by the API, which fans out)
    replica: str | None = None  # who serves it: set by a router on the first chunk (traces)
    recomputed_tokens: int = 0  # the engine's counts so far (the usage ledger): KV entries
    draft_tokens: int = 0  # preemptions threw away, speculative tokens proposed
    accepted_tokens: int = 0  # and accepted
    resumed: bool = False  # a router resumed it on another replica after a failure

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True)
class GenerateOptions:
    """Per-request settings beyond sampling, set by the gateway and the API."""

    priority: int = 1  # lower is more urgent
    tenant: str = "default"
    weight: float = 1.0
    timeout_s: float | None = None  # whole request; ends with finish_reason `timeout`
    queue_timeout_s: float | None = None  # not started by then -> `overloaded`
    # time.monotonic() in the front-end process when the HTTP request arrived: both timeouts
    # count from here (None: from arrival at the engine). Not meaningful on another machine,
    # so the wire to a remote replica sends the time left instead.
    arrival_time: float | None = None
    # Requests share cached prompt prefixes only within one salt (the gateway sets the
    # tenant's cache group); None: the tenant's name.
    cache_salt: str | None = None
    lora: str | None = None  # the LoRA adapter to run the request with; None: the base model

    def __post_init__(self) -> None:
        # Checked here, not only at the HTTP edge: a weight of 0 or a NaN deadline would
        # otherwise reach the engine core's fair queue and scheduler and bring the core down.
        if isinstance(self.priority, bool) or not isinstance(self.priority, int):
            raise ValueError(f"priority must be an integer, got {self.priority!r}")
        if not isinstance(self.tenant, str):
            raise ValueError(f"tenant must be a string, got {self.tenant!r}")
        if self.cache_salt is not None and not isinstance(self.cache_salt, str):
            raise ValueError(f"cache_salt must be a string or None, got {self.cache_salt!r}")
        if self.lora is not None and not isinstance(self.lora, str):
            raise ValueError(f"lora must be a string or None, got {self.lora!r}")
        if not _finite(self.weight) or self.weight <= 0:
            raise ValueError(f"weight must be a finite number > 0, got {self.weight!r}")
        for name in ("timeout_s", "queue_timeout_s"):
            value = getattr(self, name)
            if value is not None and (not _finite(value) or value <= 0):
                raise ValueError(f"{name} must be a finite number > 0 or None, got {value!r}")
        if self.arrival_time is not None and not _finite(self.arrival_time):
            raise ValueError(
                f"arrival_time must be a finite number or None, got {self.arrival_time!r}"
            )

    def core_request(
        self, core_id: str, ids: list[int], params: SamplingParams, eos: tuple[int, ...]
    ) -> EngineCoreRequest:
        """The core's message for a request with these options."""
        return EngineCoreRequest(
            request_id=core_id,
            prompt_token_ids=ids,
            params=params,
            priority=self.priority,
            tenant=self.tenant,
            weight=self.weight,
            timeout_s=self.timeout_s,
            queue_timeout_s=self.queue_timeout_s,
            arrival_time=self.arrival_time,
            cache_salt=self.cache_salt,
            eos_token_ids=eos,
            lora_name=self.lora,
        )


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


class EngineClient(Protocol):
    """A model replica (or a router over several) as the front end sees it."""

    @property
    def model_name(self) -> str: ...

    @property
    def max_model_len(self) -> int: ...

    @property
    def tokenizer(self) -> Tokenizer:
        """The front end's own: the caller encodes with it, the engine decodes with it."""
        ...

    def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        options: GenerateOptions | None = None,
    ) -> AsyncIterator[GenerationChunk]:
        """Start a request; raises ValueError before yielding if it can never fit."""
        ...

    async def abort(self, request_id: str) -> None: ...

    def stats(self) -> StepStats:
        """The latest step statistics (live gauges)."""
        ...

    @property
    def is_healthy(self) -> bool: ...

    @property
    def failure(self) -> str | None:
        """Why it is not healthy (None when it is)."""
        ...

    @property
    def pid(self) -> int | None:
        """The engine core's process, for a supervisor to kill when it hangs (None: none here,
        e.g. a core thread or a remote replica)."""
        ...

    def describe(self) -> dict[str, object]:
        """What /health and /v1/stats show of it beside the stats (a router: its replicas)."""
        ...

    async def close(self) -> None: ...
