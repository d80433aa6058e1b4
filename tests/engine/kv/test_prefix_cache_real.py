"""Prefix caching on a real tiny Gemma 3 (sliding-window and global layers), fp32: greedy
outputs with the cache equal outputs without it, and transformers' own."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from factories import VOCAB, hf_greedy, make_tiny

from headrace.config import CacheConfig, SchedulerConfig
from headrace.engine.core.engine_core import EngineCore
from headrace.engine.messages import EngineCoreRequest
from headrace.engine.runner.model_runner import ModelRunner
from headrace.loader.hf import load_model
from headrace.request import SamplingParams

NEW = 12
GREEDY = SamplingParams(max_tokens=NEW, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, ModelRunner]:
    path: Path = tmp_path_factory.mktemp("gemma3-prefix")
    hf_model = make_tiny("gemma3", path)  # window 12: the cached prefixes below are longer
    model, _ = load_model(path, torch.float32, torch.device("cpu"), 512)
    runner = ModelRunner.from_parts(model, path, CacheConfig(block_size=4, num_kv_blocks=256))
    return hf_model, runner


class Pool:
    """The shared runner with a smaller KV pool as far as the scheduler knows."""

    def __init__(self, runner: ModelRunner, num_kv_blocks: int) -> None:
        self.runner = runner
        self.num_kv_blocks = num_kv_blocks
        self.block_size = runner.block_size
        self.max_model_len = runner.max_model_len
        self.eos_token_ids = runner.eos_token_ids

    def execute(self, out):  # type: ignore[no-untyped-def]
        return self.runner.execute(out)


def _run(core: EngineCore, waves: list[dict[str, list[int]]]) -> dict[str, list[int]]:
    """Each wave's requests go in together once the previous wave has finished."""
    tokens: dict[str, list[int]] = {}
    for wave in waves:
        for rid, prompt in wave.items():
            core.add_request(EngineCoreRequest(rid, prompt, GREEDY))
            tokens[rid] = []
        while core.has_work():
            outputs, _ = core.step()
            for o in outputs:
                tokens[o.request_id] += o.new_token_ids
            core.block_manager.check_invariants(
                {r.request_id: r.num_computed_tokens for r in core.scheduler.running}
            )
    assert core.block_manager.num_used_blocks == 0
    return tokens


def _both(runner: object, waves: list[dict[str, list[int]]], **sched: int) -> dict[str, int]:
    """Run with and without the cache; the outputs must agree. Returns the cached tokens."""
    config = SchedulerConfig(**sched)
    cold = _run(EngineCore(config, runner), waves)  # type: ignore[arg-type]
    core = EngineCore(config, runner, enable_prefix_caching=True)  # type: ignore[arg-type]
    warm = _run(core, waves)
    assert warm == cold
    return {"hits": core.scheduler.prefix_hits_total}


def _words(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(4, VOCAB) for _ in range(n)]


def test_shared_prefix_batch_and_later_turns_equal_no_cache_and_transformers(tiny) -> None:
    hf_model, runner = tiny
    system = [1] + _words(1, 29)
    first = {f"u{i}": system + _words(10 + i, 3 + i) for i in range(4)}
    later = {f"v{i}": system + _words(20 + i, 5) for i in range(3)}
    got = _both(runner, [first, later])
    assert got["hits"] >= 3 * 28  # every later turn found the 7 full blocks of the system prompt
    core = EngineCore(SchedulerConfig(), runner, enable_prefix_caching=True)
    out = _run(core, [first, later])
    for rid, prompt in {**first, **later}.items():
        assert out[rid] == hf_greedy(hf_model, prompt, NEW), rid


def test_a_hit_covering_all_but_the_last_token(tiny) -> None:
    _, runner = tiny
    prompt = [1] + _words(2, 23)  # 24 tokens: 6 full blocks, 5 may hit
    got = _both(runner, [{"a": prompt}, {"b": prompt}, {"c": prompt + [7]}])
    assert got["hits"] == 20 + 24


def test_after_eviction(tiny) -> None:
    _, runner = tiny
    a, b = [1] + _words(3, 31), [1] + _words(4, 31)
    # 20 blocks: b's wave evicts most of a's cached blocks, then a comes again.
    waves = [{"a": a}, {"b": b}, {"a2": a + [9]}, {"b2": b + [9]}]
    config = SchedulerConfig()
    cold = _run(EngineCore(config, Pool(runner, 20)), waves)  # type: ignore[arg-type]
    core = EngineCore(config, Pool(runner, 20), enable_prefix_caching=True)  # type: ignore[arg-type]
    assert _run(core, waves) == cold
    assert core.scheduler.prefix_hits_total > 0


def test_after_preemption_and_with_chunked_prefill(tiny) -> None:
    _, runner = tiny
    system = [1] + _words(5, 15)
    wave = {f"p{i}": system + _words(30 + i, 6) for i in range(5)}
    # 16 blocks of 4 for five requests of 22 + 12 tokens: preemption is certain.
    config = SchedulerConfig(max_num_batched_tokens=7, burst_batched_tokens=28)
    cold_core = EngineCore(config, Pool(runner, 16))  # type: ignore[arg-type]
    cold = _run(cold_core, [{"seed": system + [3]}, wave])
    core = EngineCore(config, Pool(runner, 16), enable_prefix_caching=True)  # type: ignore[arg-type]
    assert _run(core, [{"seed": system + [3]}, wave]) == cold
    assert core.scheduler.num_preemptions_total > 0
    assert core.scheduler.prefix_hits_total >= 5 * 12
