"""The replica wire: what a front end and a remote replica (another `headrace serve`) exchange,
defined once and read and written with msgspec on both sides.

- `POST /v1/replica/generate` carries a `ReplicaGenerateBody` (`encode_request` writes it);
- its answer is one SSE event per `GenerationChunk` (`chunk_json`, read by `chunk_from_json`),
  the first and the last with the replica's `StepStats` under "stats";
- `POST /v1/replica/abort` carries a `ReplicaAbortBody`; `GET /v1/stats` carries `stats_json`.

Token ids travel as ids, so nothing is tokenized twice and outputs are exact. What arrives at a
replica is untrusted: `decode` checks it as strictly as the public API (types, bounds, unknown
fields; JSON as msgspec reads it has no NaN or infinity) and a bad value is a `WireError`
naming the field, never something the engine core trips on.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Annotated, Any, TypeVar

import msgspec
from msgspec import Meta

from headrace.engine.frontend.client import GenerateOptions, GenerationChunk
from headrace.engine.messages import StepStats
from headrace.param_checks import (
    MAX_BAD_WORD_SEQUENCES,
    MAX_BAD_WORD_TOKENS,
    MAX_LOGIT_BIAS,
    MAX_LOGIT_BIAS_ENTRIES,
)
from headrace.request import (
    MAX_GRAMMAR_CHARS,
    MAX_PENALTY,
    MAX_TOKENS_LIMIT,
    MIN_REPETITION_PENALTY,
    SEED_MAX,
    SamplingParams,
)
from headrace.router.deadlines import time_left

MAX_PRIORITY = 9  # as in the tenants file: a tier's priority is 0..9
MAX_WEIGHT = 1000.0  # as in the tenants file
_INT32 = 2**31 - 1

T = TypeVar("T")
TokenId = Annotated[int, Meta(ge=0, le=_INT32)]  # below the vocabulary: checked per model
Count = Annotated[int, Meta(ge=0, le=_INT32)]
Seconds = Annotated[float, Meta(gt=0)]
Name = Annotated[str, Meta(min_length=1, max_length=256)]
Penalty = Annotated[float, Meta(ge=-MAX_PENALTY, le=MAX_PENALTY)]
Stop = Annotated[str, Meta(min_length=1, max_length=256)]
TokenSequence = Annotated[list[TokenId], Meta(min_length=1, max_length=MAX_BAD_WORD_TOKENS)]
# token id (a decimal string, as JSON keys are) -> bias, as the public API takes it
LogitBias = Annotated[
    dict[
        Annotated[str, Meta(pattern=r"^[0-9]{1,10}$")],
        Annotated[float, Meta(ge=-MAX_LOGIT_BIAS, le=MAX_LOGIT_BIAS)],
    ],
    Meta(max_length=MAX_LOGIT_BIAS_ENTRIES),
]


class _FieldError(ValueError):
    """A check across fields: msgspec reports it at the object, this names the field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class WireParams(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`SamplingParams`, with the public API's bounds."""

    max_tokens: Annotated[int, Meta(ge=1, le=MAX_TOKENS_LIMIT)] = 16
    temperature: Annotated[float, Meta(ge=0, le=100)] = 1.0
    top_p: Annotated[float, Meta(gt=0, le=1)] = 1.0
    top_k: Count = 0
    seed: Annotated[int, Meta(ge=0, le=SEED_MAX)] | None = None
    seed_offset: Count = 0  # a resumed stream's draws so far
    stop: Annotated[list[Stop], Meta(max_length=16)] = []
    stop_token_ids: Annotated[list[TokenId], Meta(max_length=64)] = []
    ignore_eos: bool = False
    logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    grammar: Annotated[str, Meta(min_length=1, max_length=MAX_GRAMMAR_CHARS)] | None = None
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    repetition_penalty: Annotated[float, Meta(ge=MIN_REPETITION_PENALTY, le=MAX_PENALTY)] = 1.0
    logit_bias: LogitBias = {}
    min_p: Annotated[float, Meta(ge=0, le=1)] = 0.0
    min_tokens: Annotated[int, Meta(ge=0, le=MAX_TOKENS_LIMIT)] = 0
    # token-id sequences, tokenized by the front end
    bad_words: Annotated[list[TokenSequence], Meta(max_length=MAX_BAD_WORD_SEQUENCES)] = []
    prior_output_tokens: Count = 0  # a resumed stream's

    def __post_init__(self) -> None:
        if self.min_tokens > self.max_tokens:
            raise _FieldError(
                "min_tokens",
                f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})",
            )

    @classmethod
    def of(cls, params: SamplingParams) -> WireParams:
        """As the front end sends them (not checked here: the replica does, and says why)."""
        fields = dataclasses.asdict(params)
        fields["logit_bias"] = {str(t): b for t, b in params.logit_bias}
        return cls(**fields)

    def sampling_params(self) -> SamplingParams:
        fields = msgspec.structs.asdict(self)
        fields["stop"] = tuple(self.stop)
        fields["stop_token_ids"] = tuple(self.stop_token_ids)
        fields["logit_bias"] = tuple((int(t), b) for t, b in self.logit_bias.items())
        fields["bad_words"] = tuple(tuple(seq) for seq in self.bad_words)
        return SamplingParams(**fields)

    def token_ids(self) -> list[tuple[str, list[int]]]:
        """The token ids it names, by field, for the replica's vocabulary check."""
        return [
            ("params.stop_token_ids", list(self.stop_token_ids)),
            ("params.logit_bias", [int(t) for t in self.logit_bias]),
            ("params.bad_words", [t for seq in self.bad_words for t in seq]),
        ]


class WireOptions(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`GenerateOptions`. `arrival_time` is another machine's clock: only null is accepted,
    the deadlines are the time left when the front end sent the request."""

    priority: Annotated[int, Meta(ge=0, le=MAX_PRIORITY)] = 1
    tenant: Name = "default"
    weight: Annotated[float, Meta(gt=0, le=MAX_WEIGHT)] = 1.0
    timeout_s: Seconds | None = None
    queue_timeout_s: Seconds | None = None
    arrival_time: None = None
    cache_salt: Annotated[str, Meta(max_length=256)] | None = None
    lora: Annotated[str, Meta(max_length=128)] | None = None  # an adapter the replica holds

    @classmethod
    def of(cls, options: GenerateOptions) -> WireOptions:
        return cls(**dataclasses.asdict(time_left(options)))

    def generate_options(self, arrival_time: float | None = None) -> GenerateOptions:
        fields = msgspec.structs.asdict(self)
        fields["arrival_time"] = arrival_time
        return GenerateOptions(**fields)


class ReplicaGenerateBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    request_id: Name
    model: Name
    prompt_token_ids: Annotated[list[TokenId], Meta(min_length=1)]
    params: WireParams
    options: WireOptions = msgspec.field(default_factory=WireOptions)


class ReplicaAbortBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    request_id: Name
    model: Name


def encode_request(
    request_id: str,
    model: str,
    prompt_ids: list[int],
    params: SamplingParams,
    options: GenerateOptions,
) -> bytes:
    body = ReplicaGenerateBody(
        request_id, model, prompt_ids, WireParams.of(params), WireOptions.of(options)
    )
    return msgspec.json.encode(body)


class WireError(ValueError):
    """Bytes that are not what the wire carries. `errors()` is in pydantic's shape, which
    `headrace.api.errors.describe_validation_errors` turns into the public API's 400."""

    def __init__(self, loc: tuple[str, ...], msg: str, kind: str = "value_error") -> None:
        super().__init__(f"{'.'.join(loc) or 'body'}: {msg}")
        self.loc, self.msg, self.kind = loc, msg, kind

    @classmethod
    def of(cls, e: msgspec.ValidationError) -> WireError:
        """msgspec says where as text (`… - at `$.params.stop[3]``): made a field path."""
        found = re.fullmatch(r"(.*) - at (?:`key` in )?`\$(.*)`", str(e), re.DOTALL)
        msg, path = (found[1], found[2]) if found else (str(e), "")
        loc = re.findall(r"\w+", path)
        named = re.fullmatch(r"Object (?:contains unknown|missing required) field `(.*)`", msg)
        if named:
            loc.append(named[1])
        if isinstance(e.__cause__, _FieldError):
            loc.append(e.__cause__.field)
        return cls(tuple(loc), msg)

    def errors(self) -> list[dict[str, Any]]:
        return [{"type": self.kind, "loc": self.loc, "msg": self.msg}]


def decode(data: bytes | dict[str, Any], kind: type[T]) -> T:
    """`kind` from untrusted JSON (its bytes, or already parsed); a `WireError` if it is not."""
    try:
        if isinstance(data, bytes):
            return msgspec.json.decode(data, type=kind)
        return msgspec.convert(data, kind)
    except msgspec.ValidationError as e:
        raise WireError.of(e) from e
    except msgspec.DecodeError as e:
        raise WireError((), str(e), "json_invalid") from e


# Marks the API (`index`) and the router (`replica`, `resumed`) set on the front end's side of
# a chunk: a replica's own are not the front end's, so they stay off the wire.
_FRONT_END_MARKS = ("index", "replica", "resumed")


def chunk_json(chunk: GenerationChunk) -> dict[str, Any]:
    data: dict[str, Any] = msgspec.to_builtins(chunk)  # the finish reason as its string
    for name in _FRONT_END_MARKS:
        del data[name]
    return data


def chunk_from_json(event: dict[str, Any]) -> GenerationChunk:
    """A chunk event as the replica sent it (fields it does not know, "stats", are skipped);
    msgspec.ValidationError when it is malformed."""
    return msgspec.convert(event, GenerationChunk)


def stats_json(stats: StepStats) -> dict[str, Any]:
    data: dict[str, Any] = msgspec.to_builtins(stats)
    return data


def stats_from_json(data: dict[str, Any]) -> StepStats:
    """Fields this version does not know are ignored (a newer server may send more)."""
    return msgspec.convert(data, StepStats)
