"""Greedy tokens on the real Gemma 3 270M in bf16: a plain greedy request gets the same tokens
whatever shares its steps, and with `deterministic` also whatever its batch, chunk size,
prefix-cache hits and speculation (docs/engine.md, "Deterministic greedy")."""

from __future__ import annotations

import pytest
import torch

from headrace.config import CacheConfig, ModelConfig, SchedulerConfig
from headrace.engine.llm import LLM
from headrace.engine.runner.model_runner import ModelRunner
from headrace.kernels.int8_head import supported
from headrace.loader.tokenizer import load_tokenizer
from headrace.request import SamplingParams

pytestmark = [
    pytest.mark.gemma,
    pytest.mark.skipif(
        not supported(torch.zeros(1, 64, dtype=torch.bfloat16)),
        reason="no C compiler or no AVX-512 VNNI: the int8 head is off",
    ),
]

GREEDY = SamplingParams(max_tokens=16, temperature=0.0)
# Both change in the default mode: the first at token 1 next to sampled neighbours or in a
# batch of 9, the second at token 11 in that batch and with speculation.
TARGETS = ["Write one sentence about rivers:", "The capital of France is"]
OTHERS = [
    "def fibonacci(n):\n    ",
    "Once upon a time, in a land far away,",
    "1, 2, 3, 4,",
    "List three uses of copper:",
    "The mitochondria is",
    "Translate to French: The cat sits on the mat.",
    "Q: What is 17 times 3?\nA:",
    "My favourite colour is",
]


def _runner(config: ModelConfig) -> ModelRunner:
    runner = ModelRunner(config, CacheConfig(block_size=4, num_kv_blocks=512))
    runner.wait_greedy_head()
    return runner


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    return _runner(ModelConfig(dtype="bfloat16", device="cpu"))


def _llm(runner: ModelRunner, prefix_caching: bool = False, **sched: int) -> LLM:
    return LLM(
        runner=runner,
        tokenizer=load_tokenizer(runner.model_dir),
        cache_config=CacheConfig(enable_prefix_caching=prefix_caching),
        scheduler_config=SchedulerConfig(**sched),
    )


def test_greedy_tokens_do_not_depend_on_sampled_neighbours(runner: ModelRunner) -> None:
    llm = _llm(runner, num_speculative_tokens=0)
    sampled = SamplingParams(max_tokens=16, temperature=1.0, seed=1)
    for target in TARGETS:
        alone = llm.generate([target], [GREEDY])[0].token_ids
        mixed = llm.generate([target, *OTHERS[:2]], [GREEDY, sampled, sampled])[0].token_ids
        assert mixed == alone, target


def test_deterministic_greedy_is_batch_invariant() -> None:
    runner = _runner(ModelConfig(dtype="bfloat16", device="cpu", deterministic=True))
    drafts = 0
    for target in TARGETS:
        alone = _llm(runner, num_speculative_tokens=0).generate([target], [GREEDY])[0].token_ids
        batch = _llm(runner, num_speculative_tokens=0).generate([target, *OTHERS], [GREEDY] * 9)
        assert batch[0].token_ids == alone, target
        chunked = _llm(runner, num_speculative_tokens=0, max_num_batched_tokens=3)
        assert chunked.generate([target], [GREEDY])[0].token_ids == alone, target
        cached = _llm(runner, prefix_caching=True, num_speculative_tokens=0)
        cached.generate([target + " and"], [GREEDY])  # its blocks: the target's prefix
        assert cached.generate([target], [GREEDY])[0].token_ids == alone, target
        assert cached.core.stats().prefix_cache_hits_total > 0
        speculating = _llm(runner, num_speculative_tokens=8)
        assert speculating.generate([target], [GREEDY])[0].token_ids == alone, target
        drafts += speculating.core.stats().spec_draft_tokens_total
    assert drafts > 0  # speculation did run
