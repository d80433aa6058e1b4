"""Grammar-constrained requests in the engine, on a tiny real model in fp32: constraints hold,
free requests in the same steps are unchanged, matchers are dropped when requests end."""

from __future__ import annotations

import json
import re
from pathlib import Path

import msgspec
import pytest
import torch
from factories import make_sentencepiece_tokenizer

from headrace.api.structured import _grammar
from headrace.config import CacheConfig, ModelConfig
from headrace.engine.llm import LLM
from headrace.engine.outputs import ScheduledRequest
from headrace.engine.runner.structured import GrammarEnds, GrammarMasks
from headrace.request import FinishReason, SamplingParams

SCHEMA = {
    "type": "object",
    "properties": {
        "a": {"type": "integer", "minimum": 0, "maximum": 999},
        "b": {"enum": ["x", "y"]},
    },
    "required": ["a", "b"],
    "additionalProperties": False,
}
PROMPTS = ["Hello world", "The quick brown fox", "numbers 12345 and", "Stop strings are"]


@pytest.fixture(scope="module")
def llm(tiny_model_dir: Path) -> LLM:
    config = ModelConfig(model=str(tiny_model_dir), dtype="float32")
    return LLM(config, CacheConfig(num_kv_blocks=128))


def _grammar_of(kind: str, source: object) -> str:
    text = source if isinstance(source, str) else json.dumps(source)
    grammar, error = _grammar(kind, text)
    assert not error, error
    return grammar


def test_json_regex_and_choice_constraints_hold_greedy_and_sampled(llm: LLM) -> None:
    json_g = _grammar_of("json", SCHEMA)
    regex_g = _grammar_of("regex", r"[0-9]{3}-[a-z]{2}")
    choice_g = _grammar_of("choice", ["yes", "no", 'maybe "so"'])
    params = [
        SamplingParams(max_tokens=60, temperature=0, grammar=json_g),
        SamplingParams(max_tokens=60, temperature=1.0, seed=3, grammar=json_g),
        SamplingParams(max_tokens=20, temperature=0.8, seed=4, grammar=regex_g),
        SamplingParams(max_tokens=20, temperature=0, grammar=choice_g),
    ]
    outs = llm.generate(PROMPTS, params)
    for out in outs[:2]:
        assert out.finish_reason is FinishReason.STOP, out
        value = json.loads(out.text)
        assert set(value) == {"a", "b"} and 0 <= value["a"] <= 999 and value["b"] in "xy"
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", outs[2].text), outs[2].text
    assert outs[3].text in ("yes", "no", 'maybe "so"')


def test_free_requests_are_unchanged_by_constrained_neighbours(llm: LLM) -> None:
    free = [SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)] * len(PROMPTS)
    alone = [o.token_ids for o in llm.generate(PROMPTS, free)]
    json_g = _grammar_of("json", SCHEMA)
    constrained = [SamplingParams(max_tokens=30, temperature=0, grammar=json_g)] * len(PROMPTS)
    mixed = llm.generate(PROMPTS + PROMPTS, free + constrained)
    assert [o.token_ids for o in mixed[: len(PROMPTS)]] == alone
    assert all(json.loads(o.text) for o in mixed[len(PROMPTS) :])


def test_a_cut_value_ends_with_length_and_matchers_are_dropped(llm: LLM) -> None:
    json_g = _grammar_of("json", SCHEMA)
    [cut] = llm.generate("Hello", SamplingParams(max_tokens=3, temperature=0, grammar=json_g))
    assert cut.finish_reason is FinishReason.LENGTH and cut.text.startswith("{")
    llm.generate("Hello", SamplingParams(max_tokens=2, temperature=0))  # delivers the finish
    runner = llm.core.runner
    assert runner.grammars.num_matchers == 0  # type: ignore[attr-defined]
    assert llm.core.block_manager.num_used_blocks == 0


def test_a_retried_step_rolls_the_matcher_back_and_a_stopped_grammar_allows_only_eos() -> None:
    tok = make_sentencepiece_tokenizer()
    vocab, eos = tok.get_vocab_size(), tok.token_to_id("<eos>")
    masks = GrammarMasks(tok.to_str, vocab, [eos])
    grammar = _grammar_of("choice", ["ab"])
    a, b = tok.token_to_id("a"), tok.token_to_id("b")
    req = ScheduledRequest("r", [5], 3, [0], True, SamplingParams(grammar=grammar), 0)
    masks.prepare([req])

    def allowed(r: ScheduledRequest) -> set[int]:
        logits = torch.zeros(1, vocab)
        masks.apply(logits, [r])
        return set(torch.isfinite(logits[0]).nonzero().flatten().tolist())

    first = allowed(req)
    assert a in first and b not in first
    masks.advance([req], [a], GrammarEnds())
    assert allowed(req) == first  # the same step again (retried): rolled back, same mask
    masks.advance([req], [a], GrammarEnds())
    after_a = msgspec.structs.replace(req, num_output_tokens=1)
    assert b in allowed(after_a) and a not in allowed(after_a)
    masks.advance([after_a], [b], GrammarEnds())
    done = msgspec.structs.replace(req, num_output_tokens=2)
    assert allowed(done) == {eos}  # complete: only the end of the sequence
    masks.advance([done], [eos], GrammarEnds())  # ignore_eos: generation goes on past the grammar
    assert allowed(msgspec.structs.replace(req, num_output_tokens=3)) == {eos}
    assert allowed(done) == {eos}  # a retried step after the stop
    masks.drop(["r"])
    assert masks.num_matchers == 0
