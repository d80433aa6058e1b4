"""Penalties and biases on a real server: accepted on every generation route within their
bounds, a 400 naming the field beyond them; logit_bias bans and forces, min_tokens keeps EOS
away and bad_words stay out of the text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from tokenizers import Tokenizer

ROUTES = ["/v1/generate", "/v1/completions", "/v1/chat/completions"]
CHAT = [{"role": "user", "content": "The quick brown fox"}]

BAD: list[tuple[str, Any]] = [
    ("presence_penalty", 2.5),
    ("presence_penalty", "1"),
    ("frequency_penalty", -2.01),
    ("repetition_penalty", 0),
    ("repetition_penalty", 5e-324),  # infinite logits: NaN draws, a token the grammar refuses
    ("repetition_penalty", 2.5),
    ("min_p", 1.5),
    ("min_p", -0.1),
    ("min_tokens", -1),
    ("min_tokens", 3),  # over max_tokens (2)
    ("logit_bias", {"abc": 1}),
    ("logit_bias", {"-1": 1}),
    ("logit_bias", {"5": 101}),
    ("logit_bias", {"5": "1"}),
    ("logit_bias", {"99999": 1}),  # outside the vocabulary
    ("logit_bias", {str(i): 1 for i in range(301)}),
    ("logit_bias", {"5": 1, "05": 2}),  # the same token twice
    ("logit_bias", [5]),
    ("bad_words", "fox"),
    ("bad_words", ["   "]),
    ("bad_words", [""]),
    ("bad_words", ["x"] * 65),
    ("bad_words", ["x" * 257]),
]
GOOD: dict[str, Any] = {
    "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.2,
    "min_p": 0.05, "min_tokens": 1, "logit_bias": {"5": -100, "6": 2.5}, "bad_words": ["fox"],
}  # fmt: skip


def _body(route: str, **fields: Any) -> dict[str, Any]:
    if route.endswith("chat/completions"):
        return {"messages": CHAT, **fields}
    return {"prompt": "The quick brown fox", **fields}


def _text(route: str, answer: dict[str, Any]) -> str:
    if route == "/v1/generate":
        return str(answer["text"])
    choice = answer["choices"][0]
    return str(choice["message"]["content"] if "message" in choice else choice["text"])


@pytest.fixture(scope="module")
def tok(api_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(api_model_dir / "tokenizer.json"))


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize(("field", "value"), BAD, ids=lambda v: str(v)[:20])
def test_out_of_bounds_is_a_400_naming_the_field(
    client: httpx.Client, route: str, field: str, value: Any
) -> None:
    r = client.post(route, json=_body(route, max_tokens=2, **{field: value}))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["param"] or "").startswith(field), error


@pytest.mark.parametrize("route", ROUTES)
def test_every_field_is_accepted_within_bounds(client: httpx.Client, route: str) -> None:
    for fields in ({k: v} for k, v in GOOD.items()):
        r = client.post(route, json=_body(route, max_tokens=3, temperature=0, **fields))
        assert r.status_code == 200, (fields, r.text)
    r = client.post(route, json=_body(route, max_tokens=3, **GOOD))
    assert r.status_code == 200, r.text
    nulls = dict.fromkeys(GOOD)
    assert client.post(route, json=_body(route, max_tokens=3, **nulls)).status_code == 200


def _first_token(client: httpx.Client, **fields: Any) -> str:
    body = {"prompt": "The quick brown fox", "max_tokens": 1, "temperature": 0, "logprobs": 0}
    r = client.post("/v1/completions", json={**body, **fields})
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["logprobs"]["tokens"][0])


def _ids_by_text(tok: Tokenizer) -> dict[str, list[int]]:
    by_text: dict[str, list[int]] = {}
    for i in range(tok.get_vocab_size()):
        by_text.setdefault(tok.decode([i]), []).append(i)
    return by_text


def test_logit_bias_minus_100_bans(client: httpx.Client, tok: Tokenizer) -> None:
    first = _first_token(client)
    ban = {str(i): -100 for i in _ids_by_text(tok)[first]}
    assert _first_token(client, logit_bias=ban) != first


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 1.0, "seed": 4}])
def test_logit_bias_plus_100_forces(
    client: httpx.Client, tok: Tokenizer, route: str, sampling: dict[str, Any]
) -> None:
    by_text = _ids_by_text(tok)
    word = next(t for t, ids in by_text.items() if len(ids) == 1 and len(t) > 2 and t.isalpha())
    fields = {"max_tokens": 5, "ignore_eos": True, "logit_bias": {str(by_text[word][0]): 100}}
    r = client.post(route, json=_body(route, **fields, **sampling))
    assert r.status_code == 200, r.text
    assert _text(route, r.json()) == word * 5


@pytest.mark.parametrize("route", ROUTES)
def test_min_tokens_keeps_eos_away(client: httpx.Client, tok: Tokenizer, route: str) -> None:
    eos = tok.token_to_id("</s>")
    eager = {"max_tokens": 10, "temperature": 0, "logit_bias": {str(eos): 100}}
    usage = "usage"
    r = client.post(route, json=_body(route, **eager)).json()
    assert r[usage]["completion_tokens"] == 1
    r = client.post(route, json=_body(route, min_tokens=4, **eager)).json()
    assert r[usage]["completion_tokens"] == 5, r
    reason = r["finish_reason"] if route == "/v1/generate" else r["choices"][0]["finish_reason"]
    assert reason == "stop"


def test_bad_words_stay_out(client: httpx.Client, tok: Tokenizer) -> None:
    body = {"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0,
            "ignore_eos": True, "logprobs": 0}  # fmt: skip
    free = client.post("/v1/completions", json=body).json()["choices"][0]["logprobs"]["tokens"]

    def single_word(t: str) -> bool:
        word = t.strip()
        return (
            bool(word)
            and t in (word, " " + word)
            and len(tok.encode(t, add_special_tokens=False).ids) == 1
        )

    words = [t for t in free if single_word(t)][:2]
    assert words, free
    r = client.post("/v1/completions", json={**body, "bad_words": [w.strip() for w in words]})
    assert r.status_code == 200, r.text
    tokens = r.json()["choices"][0]["logprobs"]["tokens"]
    assert not set(words) & set(tokens) and tokens != free
