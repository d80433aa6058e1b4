"""Structured outputs at the front end: a request's constraint, under whichever name its client
sends it — OpenAI's `response_format`, vLLM's `structured_outputs` and `guided_*` — becomes one
llguidance grammar (`SamplingParams.grammar`), checked before anything runs: a schema or regex
the engine cannot use is a 400 naming the field, and so is a `min_tokens` no choice can reach.
Grammars are cached by their source (`grammar_cache`), so a client that sends the same schema
again pays nothing.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from headrace.api.errors import bad_request
from headrace.api.grammar_cache import GrammarCache
from headrace.api.text import Text

# Readable JSON a small model tokenizes well ({"a": 1, "b": [2, 3]}); no free whitespace, so a
# model cannot spend its tokens on newlines inside a value.
JSON_OPTIONS = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}
_STRICT = ConfigDict(strict=True, allow_inf_nan=False, extra="forbid", populate_by_name=True)
Choice = list[Text]


class JsonSchemaFormat(BaseModel):
    model_config = _STRICT

    name: Text = Field("response", max_length=256)
    description: Text | None = None
    json_schema: dict[str, Any] = Field(alias="schema", default_factory=dict)
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's: `text` (no constraint), `json_object` (any JSON object) or `json_schema`."""

    model_config = _STRICT

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs`: exactly one of these."""

    model_config = _STRICT

    json_: dict[str, Any] | Text | None = Field(None, alias="json")
    regex: Text | None = None
    choice: Choice | None = Field(None, min_length=1, max_length=1024)
    grammar: Text | None = None
    json_object: bool | None = None


class StructuredFields(BaseModel):
    """The constraint fields of every generation route; at most one may be set."""

    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | Text | None = None
    guided_regex: Text | None = None
    guided_choice: Choice | None = Field(None, min_length=1, max_length=1024)
    guided_grammar: Text | None = Field(None, description="a Lark grammar (llguidance's)")


def grammar_cache() -> GrammarCache:
    """A server's cache of compiled grammars. llguidance is imported now, as the server is
    made: imported at the first constraint (0.1 s or more, mostly under the GIL) it would
    pause every stream this front end is sending."""
    import llguidance  # noqa: F401

    return GrammarCache(_grammar)


async def grammar_for(
    body: StructuredFields, cache: GrammarCache, min_tokens: int = 0
) -> str | None:
    """`grammar_of`, in a worker thread when there is a constraint: a large schema takes
    milliseconds to check, which the event loop (refusals, /health, streams) should not wait."""
    if not _constraints(body):
        return None
    return await asyncio.to_thread(grammar_of, body, cache, min_tokens)


def grammar_of(body: StructuredFields, cache: GrammarCache, min_tokens: int = 0) -> str | None:
    """The llguidance grammar of the request's constraint, or None; 400 if it cannot be used.
    `min_tokens`: where EOS is banned (0 under ignore_eos)."""
    found = _constraints(body)
    if not found:
        return None
    if len(found) > 1:
        names = ", ".join(f"`{field}`" for field, _, _ in found)
        raise bad_request(f"set only one output constraint, not {names}", found[1][0])
    field, kind, source = found[0]
    if kind == "choice":
        _check_reachable(field, json.loads(source), min_tokens)
    grammar, error = cache.get(kind, source)
    if error:
        raise bad_request(f"`{field}` cannot be used: {error}", field)
    return grammar


def constraint_fields(body: StructuredFields) -> list[str]:
    """The names of the constraint fields a request set."""
    return [field for field, _, _ in _constraints(body)]


def _check_reachable(field: str, choices: list[str], min_tokens: int) -> None:
    """A choice of n bytes is at most n tokens, after which only EOS is allowed: a min_tokens
    above the longest one would leave the request no token to go on with."""
    longest = max(len(c.encode()) for c in choices)
    if min_tokens > longest:
        raise bad_request(
            f"min_tokens ({min_tokens}) cannot be reached with `{field}`: its longest choice "
            f"is {longest} bytes, at most {longest} tokens",
            "min_tokens",
        )


def _constraints(body: StructuredFields) -> list[tuple[str, str, str]]:
    """(field, kind, source) for each constraint set: kind is json, regex, choice or lark."""
    out: list[tuple[str, str, str]] = []
    fmt = body.response_format
    if fmt is not None and fmt.type == "json_object":
        out.append(("response_format", "json", "{}"))
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None:
            raise bad_request("`response_format.json_schema` is required", "response_format")
        out.append(("response_format", "json", canonical(fmt.json_schema.json_schema)))
    so = body.structured_outputs
    if so is not None:
        for kind, value in (
            ("json", so.json_), ("regex", so.regex), ("choice", so.choice),
            ("lark", so.grammar), ("json", {} if so.json_object else None),
        ):  # fmt: skip
            if value is not None:
                out.append(("structured_outputs", kind, _source(kind, value)))
    for field, kind in (
        ("guided_json", "json"), ("guided_regex", "regex"), ("guided_choice", "choice"),
        ("guided_grammar", "lark"),
    ):  # fmt: skip
        value = getattr(body, field)
        if value is not None:
            out.append((field, kind, _source(kind, value)))
    return out


def _source(kind: str, value: object) -> str:
    if kind == "choice":
        return json.dumps(value)
    if kind == "json":
        return canonical(value)
    assert isinstance(value, str)
    return value


def canonical(schema: object) -> str:
    """A schema as one cache key, whether it came as an object or as JSON text."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            return f"\x00{e}"  # not JSON: reported by _grammar
    return json.dumps(schema, sort_keys=True, separators=(",", ":"))


def _grammar(kind: str, source: str) -> tuple[str, str]:
    """(grammar, error message or ""), uncached."""
    from llguidance import LLMatcher

    if source.startswith("\x00"):
        return "", f"the schema is not valid JSON: {source[1:]}"
    try:
        if kind == "json":
            schema = json.loads(source) or {"type": "object"}  # {} : json_object
            if not isinstance(schema, dict):
                return "", "a JSON schema must be an object"
            grammar = LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)  # type: ignore[arg-type]
        elif kind == "regex":
            grammar = LLMatcher.grammar_from_regex(source)
        elif kind == "choice":
            grammar = LLMatcher.grammar_from_lark(_choice_lark(json.loads(source)))
        else:
            grammar = LLMatcher.grammar_from_lark(source)
    except ValueError as e:
        return "", str(e)
    return grammar, LLMatcher.validate_grammar(grammar)


def _choice_lark(choices: list[str]) -> str:
    # A JSON string literal is a Lark string literal: quotes and escapes carry over.
    return "start: " + " | ".join(json.dumps(c) for c in choices)
