"""The boundary between a replica's front end and its engine core: every message that crosses
it, typed, and how it is written on the wire.

front end -> core: `EngineCoreRequest` (token ids only), `AbortRequests`, `Shutdown`.
core -> front end: `CoreReady` (or `CoreFailed`) once, then `CoreOutputs` after every step.

The front end (`async_engine`) and the core's loop (`core_loop`) both import this module and
nothing of each other. A core process gets the messages as MessagePack (msgspec: one tagged
union per direction, decoded straight into these types, so a field of the wrong type is refused
at the door); a core thread gets the same objects unencoded. Messages and the per-request
outputs travel as arrays (no field names: a step report of 32 outputs is 3x smaller); the stats
and logprobs as maps, the shape the router's HTTP wire also sends.
"""

from __future__ import annotations

import math

import msgspec

from headrace.request import FinishReason, SamplingParams

# -- what a step produces ---------------------------------------------------------------------


class TokenLogprobs(msgspec.Struct, frozen=True):
    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # (token_id, logprob) of the most likely alternatives


class RequestOutput(msgspec.Struct, frozen=True, array_like=True):
    """What the engine core reports for one request after a step."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: FinishReason | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    logprobs: list[TokenLogprobs] = msgspec.field(default_factory=list)
    error: str | None = None  # set with finish_reason ERROR
    queue_time: float | None = None  # arrival -> first scheduled, seconds (set once started)
    num_cached_tokens: int = 0  # prompt tokens the prefix cache held when first scheduled
    num_recomputed_tokens: int = 0  # KV entries preemptions threw away, so far (the ledger)
    num_draft_tokens: int = 0  # speculative tokens proposed, so far
    num_accepted_tokens: int = 0  # ... and accepted

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class StepStats(msgspec.Struct, frozen=True):
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
    # Speculative decoding: draft tokens checked by the model so far, and accepted.
    spec_draft_tokens_total: int = 0
    spec_accepted_tokens_total: int = 0
    # --async-scheduling: steps left running while the next one was scheduled, so far
    steps_overlapped_total: int = 0
    # Per LoRA adapter with requests or tokens: (name, running, waiting, tokens computed since
    # the start), sorted by name.
    lora_requests: tuple[tuple[str, int, int, int], ...] = ()
    # LoRA adapters read from disk (loads and reloads after an eviction) and evicted from memory
    # (--max-cpu-loras) since the engine started.
    lora_loads_total: int = 0
    lora_evictions_total: int = 0
    # Every registered adapter: (name, replicas holding its weights in memory, loads, evictions),
    # sorted by name (the dashboard's LoRA panel); and --max-loras (lora_requests_info).
    lora_adapters: tuple[tuple[str, int, int, int], ...] = ()
    max_loras: int = 0

    @property
    def prefix_cache_hit_rate(self) -> float:
        q = self.prefix_cache_queries_total
        return self.prefix_cache_hits_total / q if q else 0.0

    @property
    def kv_usage(self) -> float:
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0


# -- front end -> core ------------------------------------------------------------------------


class EngineCoreRequest(msgspec.Struct, frozen=True, tag="request", array_like=True):
    """A tokenized request as the front end hands it to a core."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int = 1
    tenant: str = "default"
    weight: float = 1.0
    timeout_s: float | None = None  # whole request, from arrival_time
    queue_timeout_s: float | None = None  # not started by then -> `overloaded`
    # time.monotonic() when the request reached the front end (CLOCK_MONOTONIC is system-wide,
    # so it holds in a core process on the same machine); None: arrival at the core.
    arrival_time: float | None = None
    # Requests share cached prefix blocks only within one salt; None: the tenant's name.
    cache_salt: str | None = None
    # End-of-sequence tokens beside the model's own: the front end's tokenizer knows them
    # (its EOS and the chat format's turn end); the core never loads a tokenizer.
    eos_token_ids: tuple[int, ...] = ()
    lora_name: str | None = None  # a LoRA adapter the core's runner holds; None: the base

    def validate(self) -> None:
        """ValueError for a field of the wrong type or range. A core thread gets the object
        itself, unchecked by a decoder, so the core calls this before a field can reach the
        scheduler's arithmetic."""
        if not isinstance(self.request_id, str) or not isinstance(self.tenant, str):
            raise ValueError("request_id and tenant must be strings")
        if self.cache_salt is not None and not isinstance(self.cache_salt, str):
            raise ValueError(f"cache_salt must be a string or None, got {self.cache_salt!r}")
        if self.lora_name is not None and not isinstance(self.lora_name, str):
            raise ValueError(f"lora_name must be a string or None, got {self.lora_name!r}")
        for name in ("prompt_token_ids", "eos_token_ids"):
            ids = getattr(self, name)
            if not isinstance(ids, list | tuple) or not all(type(t) is int and t >= 0 for t in ids):
                raise ValueError(f"{name} must be a list of non-negative integers")
        if not isinstance(self.params, SamplingParams):
            raise ValueError(f"params must be SamplingParams, got {type(self.params).__name__}")
        self.params.validate()
        if type(self.priority) is not int:
            raise ValueError(f"priority must be an integer, got {self.priority!r}")
        if not _finite(self.weight) or self.weight <= 0:
            raise ValueError(f"weight must be a finite number > 0, got {self.weight!r}")
        for name in ("timeout_s", "queue_timeout_s", "arrival_time"):
            value = getattr(self, name)
            if value is not None and not (
                _finite(value) and (name == "arrival_time" or value >= 0)
            ):
                raise ValueError(f"{name} must be a finite number of seconds, got {value!r}")


class AbortRequests(msgspec.Struct, frozen=True, tag="abort", array_like=True):
    request_ids: list[str]


class Shutdown(msgspec.Struct, frozen=True, tag="shutdown", array_like=True):
    pass


class LoraCommand(msgspec.Struct, frozen=True, tag="lora", array_like=True):
    """Load the LoRA adapter in directory `path` as `name` (the core reads the files itself),
    or unload `name` (`path` None); answered by a `LoraDone` of the same `command_id`."""

    command_id: str
    name: str
    path: str | None = None


# -- core -> front end ------------------------------------------------------------------------


class CoreReady(msgspec.Struct, frozen=True, tag="ready", array_like=True):
    """The core's model is loaded: what the front end needs to know of it (no tokenizer: the
    front end loads its own)."""

    model_name: str
    max_model_len: int
    num_kv_blocks: int
    block_size: int
    eos_token_ids: tuple[int, ...]  # the model's own (config and generation config)
    runner: dict[str, str | int] = msgspec.field(default_factory=dict)  # device, dtype, ...


class CoreFailed(msgspec.Struct, frozen=True, tag="failed", array_like=True):
    error: str  # the model could not be loaded


class CoreOutputs(msgspec.Struct, frozen=True, tag="outputs", array_like=True):
    outputs: list[RequestOutput]
    stats: StepStats


class LoraDone(msgspec.Struct, frozen=True, tag="lora_done", array_like=True):
    command_id: str
    error: str | None = None  # why the command was refused; nothing changed then


ToCore = EngineCoreRequest | AbortRequests | Shutdown | LoraCommand
FromCore = CoreReady | CoreFailed | CoreOutputs | LoraDone

_encoder = msgspec.msgpack.Encoder()
_to_core = msgspec.msgpack.Decoder(ToCore)
_from_core = msgspec.msgpack.Decoder(FromCore)


def encode(msg: ToCore | FromCore) -> bytes:
    return _encoder.encode(msg)


def decode_to_core(data: bytes) -> ToCore:
    """msgspec.DecodeError (a ValidationError for a field of the wrong type) if unreadable."""
    return _to_core.decode(data)


def decode_from_core(data: bytes) -> FromCore:
    return _from_core.decode(data)


def _finite(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
