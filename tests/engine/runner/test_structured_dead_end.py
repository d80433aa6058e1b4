"""A constrained request its grammar leaves no allowed token (min_tokens bans them all) ends
alone, in the step that meets it: `stop` when its grammar is complete, else `error`; the
bystanders in the same batch get their normal tokens and the step is not retried in halves."""

from __future__ import annotations

import logging
from pathlib import Path

import llguidance
import pytest

from headrace.api.structured import _grammar
from headrace.config import CacheConfig, ModelConfig
from headrace.engine.llm import LLM
from headrace.request import FinishReason, SamplingParams

RETRY_LOG = "retrying it in halves"
FREE = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_model_dir: Path) -> LLM:
    config = ModelConfig(model=str(tiny_model_dir), dtype="float32")
    return LLM(config, CacheConfig(num_kv_blocks=128))


def first_tokens(model_dir: Path, grammar: str, vocab: int) -> list[int]:
    """The tokens `grammar` allows first (what a request must ban to leave it nowhere to go)."""
    table = llguidance.LLTokenizer((model_dir / "tokenizer.json").read_text(), n_vocab=vocab)
    matcher = llguidance.LLMatcher(table, grammar, log_level=0)
    mask = matcher.compute_logit_bias()
    return [t for t in range(vocab) if mask[t]]


def regex(source: str) -> str:
    grammar, error = _grammar("regex", source)
    assert not error, error
    return grammar


def test_dead_ends_end_alone_without_a_retry(
    llm: LLM, tiny_model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    grammar = regex("a")
    vocab = llm.core.runner.vocab_size  # type: ignore[attr-defined]
    a_tokens = first_tokens(tiny_model_dir, grammar, vocab)
    assert 0 < len(a_tokens) <= 8, a_tokens
    prompts = ["Hello world", "The quick brown fox", "numbers 12345 and", "Stop strings are"]
    alone = [o.token_ids for o in llm.generate([prompts[0], prompts[3]], [FREE, FREE])]
    stuck = SamplingParams(
        max_tokens=5, min_tokens=2, stop_token_ids=tuple(a_tokens), grammar=grammar
    )
    complete = SamplingParams(max_tokens=5, min_tokens=3, grammar=grammar)
    with caplog.at_level(logging.WARNING):
        outs = llm.generate(prompts, [FREE, stuck, complete, FREE])
    assert RETRY_LOG not in caplog.text
    assert [outs[0].token_ids, outs[3].token_ids] == alone  # the bystanders are unchanged
    assert outs[1].finish_reason is FinishReason.ERROR and outs[1].token_ids == []
    assert "every token its grammar allows next is banned" in (outs[1].error or ""), outs[1]
    # Complete after "a", then only EOS, which min_tokens bans: it stops there.
    assert outs[2].finish_reason is FinishReason.STOP, outs[2]
    assert outs[2].text == "a" and len(outs[2].token_ids) == 1, outs[2]
    assert llm.core.block_manager.num_used_blocks == 0
