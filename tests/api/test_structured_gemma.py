"""Structured outputs on the real Gemma 3 270M behind `headrace serve`: JSON schema, JSON mode,
regex and choice constraints hold, and the `openai` SDK's `parse` works unmodified. (That free
requests are unchanged by constrained neighbours is tested in fp32, in tests/engine: in bf16 a
batch's composition moves logits by a rounding.)"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import httpx
import jsonschema
import openai
import pytest
from factories import Server
from pydantic import BaseModel, Field

pytestmark = pytest.mark.gemma

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "score": {"type": "number", "minimum": 0, "maximum": 10},
        "colour": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "zip": {"type": "integer", "minimum": 1000, "maximum": 99999},
            },
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "score", "colour", "tags", "address"],
    "additionalProperties": False,
}
SUBJECTS = [
    "a baker in Lyon", "a retired pilot", "a young chess player", "a fisherman", "a nurse",
    "a painter", "a student of music", "a farmer", "a taxi driver", "an old librarian",
    "a chef", "a swimmer", "a gardener", "a journalist", "a teacher", "a mountain guide",
    "a programmer", "a tailor", "a beekeeper", "a violinist",
]  # fmt: skip


@pytest.fixture
def server(gemma_server: Server) -> Server:
    return gemma_server


def _complete(server: Server, prompt: str, **body: Any) -> dict[str, Any]:
    r = httpx.post(
        server.url + "/v1/completions",
        json={"prompt": prompt, "max_tokens": 120, "temperature": 0, **body},
        timeout=300,
    )
    assert r.status_code == 200, r.text
    return dict(r.json()["choices"][0])


def test_json_schema_outputs_parse_and_validate_for_20_prompts(server: Server) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}

    def one(subject: str) -> dict[str, Any]:
        return _complete(server, f"A short profile of {subject}, as JSON:\n", response_format=fmt)

    with ThreadPoolExecutor(20) as pool:  # 20 constrained requests sharing steps
        choices = list(pool.map(one, SUBJECTS))
    for choice in choices:
        assert choice["finish_reason"] == "stop", choice
        jsonschema.validate(json.loads(choice["text"]), SCHEMA)


def test_json_mode_regex_and_choice_hold(server: Server) -> None:
    few_shot = 'A point as JSON: {"x": 1, "y": 2}\nA colour as JSON: '
    obj = _complete(server, few_shot, response_format={"type": "json_object"})
    assert isinstance(json.loads(obj["text"]), dict)
    date = _complete(server, "Today's date is ", guided_regex=r"20[0-9]{2}-[01][0-9]-[0-3][0-9]")
    assert len(date["text"]) == 10 and date["text"].startswith("20"), date
    pick = _complete(
        server, "The sky is", structured_outputs={"choice": ["blue", "green", "on fire"]}
    )
    assert pick["text"] in ("blue", "green", "on fire")


def test_max_tokens_cutting_a_json_value_short_is_length(server: Server) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}
    choice = _complete(server, "A profile as JSON:\n", response_format=fmt, max_tokens=5)
    assert choice["finish_reason"] == "length"
    assert choice["text"].startswith("{")


class Colour(BaseModel):
    name: str = Field(max_length=20)
    kind: Literal["warm", "cold"]
    brightness: int = Field(ge=0, le=10)


def test_openai_sdk_parse_works_unmodified(server: Server) -> None:
    with openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as sdk:
        (model,) = [m.id for m in sdk.models.list()]
        done = sdk.chat.completions.parse(
            model=model, messages=[{"role": "user", "content": "Describe a colour."}],
            response_format=Colour, max_tokens=80, temperature=0,
        )  # fmt: skip
    parsed = done.choices[0].message.parsed
    assert isinstance(parsed, Colour) and parsed.kind in ("warm", "cold")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "objectx"}},
                }
            },
            "response_format",
        ),  # fmt: skip
        ({"guided_regex": "[a-z]+("}, "guided_regex"),
        ({"guided_json": "{not json"}, "guided_json"),
        ({"guided_grammar": "start: %%%"}, "guided_grammar"),
        ({"guided_regex": "a+", "guided_choice": ["a"]}, "guided_choice"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
    ],
)
def test_a_constraint_that_cannot_be_used_is_a_400_naming_it(
    server: Server, body: dict[str, Any], param: str
) -> None:
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "x", **body}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
