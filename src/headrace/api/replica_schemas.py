"""What a replica accepts on `POST /v1/replica/generate` and `/v1/replica/abort`
(`headrace.router.wire` writes it), checked as strictly as the public API: types, bounds, NaN
and infinity, unknown fields. A bad value is a 400 naming the field, never something the engine
core trips on.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from headrace.api.schemas import MAX_TOKENS_LIMIT, SEED_MAX, LogitBias, Penalty, Stop
from headrace.api.text import Text
from headrace.engine.frontend.client import GenerateOptions
from headrace.request import (
    MAX_BAD_WORD_SEQUENCES,
    MAX_BAD_WORD_TOKENS,
    MAX_GRAMMAR_CHARS,
    MAX_PENALTY,
    MIN_REPETITION_PENALTY,
    SamplingParams,
)

MAX_PRIORITY = 9  # as in the tenants file: a tier's priority is 0..9
MAX_WEIGHT = 1000.0  # as in the tenants file

_STRICT = ConfigDict(strict=True, allow_inf_nan=False, extra="forbid")

TokenId = Annotated[int, Field(ge=0, le=2**31 - 1)]  # below the vocabulary: checked per model
Seconds = Annotated[float, Field(gt=0)]
TokenSequence = Annotated[list[TokenId], Field(min_length=1, max_length=MAX_BAD_WORD_TOKENS)]


class WireParams(BaseModel):
    """`SamplingParams`, with the public API's bounds."""

    model_config = _STRICT

    max_tokens: int = Field(default=16, ge=1, le=MAX_TOKENS_LIMIT)
    temperature: float = Field(default=1.0, ge=0, le=100)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=0, ge=0, le=2**31 - 1)
    seed: int | None = Field(default=None, ge=0, le=SEED_MAX)
    seed_offset: int = Field(default=0, ge=0, le=2**31 - 1)  # a resumed stream's draws so far
    stop: list[Stop] = Field(default_factory=list, max_length=16)
    stop_token_ids: list[TokenId] = Field(default_factory=list, max_length=64)
    ignore_eos: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=20)
    grammar: Text | None = Field(default=None, min_length=1, max_length=MAX_GRAMMAR_CHARS)
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    repetition_penalty: float = Field(default=1.0, ge=MIN_REPETITION_PENALTY, le=MAX_PENALTY)
    logit_bias: LogitBias = Field(default_factory=dict)  # as the API: {"token id": bias}
    min_p: float = Field(default=0.0, ge=0, le=1)
    min_tokens: int = Field(default=0, ge=0, le=MAX_TOKENS_LIMIT)
    bad_words: list[TokenSequence] = Field(
        default_factory=list, max_length=MAX_BAD_WORD_SEQUENCES
    )  # token-id sequences, tokenized by the front end
    prior_output_tokens: int = Field(default=0, ge=0, le=2**31 - 1)  # a resumed stream's

    @field_validator("min_tokens")
    @classmethod
    def _within_max_tokens(cls, value: int, info: ValidationInfo) -> int:
        max_tokens = info.data.get("max_tokens")
        if max_tokens is not None and value > max_tokens:
            raise ValueError(f"min_tokens ({value}) must not exceed max_tokens ({max_tokens})")
        return value

    def sampling_params(self) -> SamplingParams:
        fields = self.model_dump()
        fields["stop"] = tuple(self.stop)
        fields["stop_token_ids"] = tuple(self.stop_token_ids)
        fields["logit_bias"] = tuple((int(t), b) for t, b in self.logit_bias.items())
        fields["bad_words"] = tuple(tuple(seq) for seq in self.bad_words)
        return SamplingParams(**fields)

    def token_ids(self) -> list[tuple[str, list[int]]]:
        """The token ids it names, by field, for the replica's vocabulary check."""
        return [
            ("params.stop_token_ids", self.stop_token_ids),
            ("params.logit_bias", [int(t) for t in self.logit_bias]),
            ("params.bad_words", [t for seq in self.bad_words for t in seq]),
        ]


class WireOptions(BaseModel):
    """`GenerateOptions`. `arrival_time` is another machine's clock: only null is accepted,
    the deadlines are the time left when the front end sent the request."""

    model_config = _STRICT

    priority: int = Field(default=1, ge=0, le=MAX_PRIORITY)
    tenant: Text = Field(default="default", min_length=1, max_length=256)
    weight: float = Field(default=1.0, gt=0, le=MAX_WEIGHT)
    timeout_s: Seconds | None = None
    queue_timeout_s: Seconds | None = None
    arrival_time: None = None
    cache_salt: Text | None = Field(default=None, max_length=256)
    lora: Text | None = Field(default=None, max_length=128)  # an adapter the replica holds

    def generate_options(self, arrival_time: float | None = None) -> GenerateOptions:
        fields = self.model_dump()
        fields["arrival_time"] = arrival_time
        return GenerateOptions(**fields)


class ReplicaGenerateBody(BaseModel):
    model_config = _STRICT

    request_id: Text = Field(min_length=1, max_length=256)
    model: Text = Field(min_length=1, max_length=256)
    prompt_token_ids: list[TokenId] = Field(min_length=1)
    params: WireParams
    options: WireOptions = Field(default_factory=lambda: WireOptions())


class ReplicaAbortBody(BaseModel):
    model_config = _STRICT

    request_id: Text = Field(min_length=1, max_length=256)
    model: Text = Field(min_length=1, max_length=256)


def params_from_json(data: dict[str, Any]) -> SamplingParams:
    """Raises ValueError (pydantic's ValidationError) for fields that are not valid settings."""
    return WireParams.model_validate(data).sampling_params()


def options_from_json(data: dict[str, Any]) -> GenerateOptions:
    """Raises ValueError (pydantic's ValidationError) for fields that are not valid options."""
    return WireOptions.model_validate(data).generate_options()
